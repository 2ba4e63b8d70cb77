-- The spending limits' charges go with the dedup store's period in which they were counted
-- (the period of the counting message's own record), found by that period: dropping a
-- period no longer joins the charges with every record of its partition (a day's records
-- read to find the few charges among them, PostgreSQL's time growing with the records).
-- A BRIN index: the charges are written in the order of their periods, and a BRIN index
-- costs a charge's INSERT next to nothing (a b-tree would add an index entry to each).
-- Charges counted before this migration have no period: they go with the record they are
-- kept under, as before, found through a partial index that only they are in.
-- (Adding a column without a default rewrites nothing; the two indexes read the charges
-- once, one row per approved message on a card with a limit, under a lock that holds
-- their writes.)
ALTER TABLE limit_charges ADD COLUMN dedup_period timestamptz;
CREATE INDEX limit_charges_dedup_period_idx ON limit_charges
    USING brin (dedup_period) WITH (autosummarize = on);
CREATE INDEX limit_charges_before_periods_idx ON limit_charges (txn_id)
    WHERE dedup_period IS NULL;
