-- payauth_limits_counted: what a set-based route's approvals count, as
-- payauth_limits_charge takes it: one row of arrays, one element per (approved message,
-- limit with a period), the charge kept under the purchase or hold a reversal would name
-- (an INCREMENTAL's: its original). No such pair: one row of NULLs, which charges nothing.
CREATE OR REPLACE FUNCTION payauth_limits_counted(
    p_msg        integer[],   -- per pair (payauth_batch_controls)
    p_limit      text[],
    p_start      date[],
    p_granted    numeric[],   -- per pair: what the approval counted; NULL: nothing
    p_txn_ids    text[],      -- per message
    p_auth_types text[],
    p_originals  text[]
) RETURNS TABLE (under text[], txn text[], lim text[], start date[], amount numeric[])
LANGUAGE sql IMMUTABLE
AS $$
    -- (Aggregated in one pass over rows sorted once: an ORDER BY in each aggregate would
    -- sort the pairs once per array.)
    SELECT array_agg(CASE WHEN x.kind = 'INCREMENTAL' THEN x.orig ELSE x.txn END),
           array_agg(x.txn), array_agg(x.lim), array_agg(x.start), array_agg(x.g)
      FROM (SELECT m.txn, m.kind, m.orig, q.lim, q.start, q.g
              FROM unnest(p_msg, p_limit, p_start, p_granted)
                       WITH ORDINALITY AS q(i, lim, start, g, k)
              JOIN unnest(p_txn_ids, p_auth_types, p_originals)
                       WITH ORDINALITY AS m(txn, kind, orig, ord)
                ON m.ord = q.i
             WHERE q.g IS NOT NULL AND q.start IS NOT NULL
             ORDER BY q.k) x
$$;

REVOKE ALL ON FUNCTION payauth_limits_counted FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limits_counted TO payauth_worker;
