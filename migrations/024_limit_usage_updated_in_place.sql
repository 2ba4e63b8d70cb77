-- A limit's usage row is updated by every batch that counts in it (payauth_limits_charge):
-- with its pages full, most updates put the new version on another page, a new entry in
-- each of the table's two indexes and one more WAL record each. Half of each page kept free
-- lets the new version stay on its page (a heap-only update: no index entry); a row is a
-- few dozen bytes, the table one row per limit and period. (Pages written before this keep
-- their fill until rewritten; the new setting applies to every page written after.)
ALTER TABLE limit_usage SET (fillfactor = 50);
