-- payauth_expire_holds: `payauth holds expire --execute` (service/ops/holds.py) ends, as
-- EXPIRED, the active holds placed at least p_hours ago by the database's clock (now():
-- this transaction's start), up to p_limit holds' accounts per call. The accounts are
-- locked first, in the order every writer uses (account_id), so a worker deciding a
-- clearing of the same hold waits or is waited for; the UPDATE finds each hold still
-- ACTIVE or skips it (a hold already ended, by a message or another run). Returns the
-- holds it ended.
CREATE OR REPLACE FUNCTION payauth_expire_holds(p_hours numeric, p_limit integer)
RETURNS TABLE (txn_id text, account_id text, currency text, released text,
               ended_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    cutoff timestamptz := now() - p_hours * interval '1 hour';
    ids    text[];
BEGIN
    SELECT array_agg(DISTINCT s.account_id) INTO ids
      FROM (SELECT h.account_id FROM holds h
             WHERE h.state = 'ACTIVE' AND h.placed_at <= cutoff
             ORDER BY h.placed_at LIMIT p_limit) s;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM accounts a WHERE a.account_id = ANY(ids) ORDER BY a.account_id FOR UPDATE;
    RETURN QUERY
    WITH ended AS (
        UPDATE holds h
           SET state = 'EXPIRED', ended_at = now(), released = h.remaining, remaining = 0
         WHERE h.account_id = ANY(ids) AND h.state = 'ACTIVE' AND h.placed_at <= cutoff
        RETURNING h.txn_id, h.account_id, h.currency::text AS currency, h.released,
                  h.ended_at
    ), moved AS (
        UPDATE accounts a SET held = a.held - e.released, updated_at = now()
          FROM (SELECT e.account_id, sum(e.released) AS released FROM ended e
                 GROUP BY e.account_id) e
         WHERE a.account_id = e.account_id
        RETURNING 1
    )
    SELECT e.txn_id, e.account_id, e.currency, e.released::text, e.ended_at FROM ended e;
END
$$;

REVOKE ALL ON FUNCTION payauth_expire_holds FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_expire_holds TO payauth_worker;
