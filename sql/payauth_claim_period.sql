-- payauth_claim_period: the period this transaction claims its transaction_ids in, behind
-- the fence that keeps a transaction_id to one decision across a period's end.
--
-- Within a period, the primary key (txn_id, dedup_period) is the claim: an INSERT of a key
-- another open transaction inserted waits for it, then conflicts. Across periods no index
-- sees both rows, so two replicas deciding one transaction_id at once, one just before a
-- period's end and one just after, would both claim it. The fence orders them instead:
--
-- 1. A claim reads the clock (payauth_dedup_clock), takes a shared transaction lock on its
--    period, and reads the clock again: a claim whose period ended meanwhile (it straddled
--    the end) is refused with SQLSTATE 40001 and retried, in the next period. So every
--    claim that goes on took its lock before its period ended.
-- 2. A claim in period P waits, once per connection, until no claim holds period P-1's lock
--    (an exclusive lock taken and let go at once): every claim of P-1 that goes on took its
--    lock before P began, hence before this wait, and is committed or rolled back when it
--    ends. A claim of P-1 never waits for one of P, so they never deadlock.
-- 3. The caller then probes period P-1 for its keys (payauth_authorize): a record a claim of
--    P-1 committed after the caller's lookup is found there, and its claim is lost.
--    Only in READ COMMITTED, where each statement sees what committed before it: a claim
--    in a transaction of another isolation level is refused (SQLSTATE 25001).
--
-- Called first by payauth_authorize, before any row lock (a claim of P-1 it waits for may
-- be waiting for an account); a second call in the same transaction answers the same
-- period. A transaction is assumed to take less than a period from its fence to
-- its commit: the worker's statement_timeout bounds it far below. (The period's text, kept
-- in the transaction's setting, is read back in the session's time zone, the same one.)
CREATE OR REPLACE FUNCTION payauth_claim_period() RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    fenced   text := current_setting('payauth.claim_period', true);
    period   timestamptz;
    previous timestamptz;
    -- A period's lock: "payd" in the high half, the period's start (epoch seconds) below.
    fence    constant bigint := 1885436260::bigint << 32;
BEGIN
    IF fenced <> '' THEN
        RETURN fenced::timestamptz;
    END IF;
    -- (Step 3 reads what claims of P-1 committed after this transaction began: a snapshot
    -- taken for the whole transaction would not see them.)
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a claim needs READ COMMITTED, not %',
                        upper(current_setting('transaction_isolation'))
              USING ERRCODE = '25001';
    END IF;
    period := payauth_dedup_period(payauth_dedup_clock());
    PERFORM pg_advisory_xact_lock_shared(fence + extract(epoch FROM period)::bigint);
    IF payauth_dedup_period(payauth_dedup_clock()) <> period THEN
        RAISE EXCEPTION 'a claim straddled the end of the dedup period of %', period
              USING ERRCODE = '40001', HINT = 'retried, in the next period';
    END IF;
    previous := payauth_dedup_period(period - interval '1 microsecond');
    IF current_setting('payauth.closed_period', true) IS DISTINCT FROM previous::text THEN
        -- (A session lock, let go at once; a cancelled wait must not leave it held.)
        BEGIN
            PERFORM pg_advisory_lock(fence + extract(epoch FROM previous)::bigint);
            PERFORM pg_advisory_unlock(fence + extract(epoch FROM previous)::bigint);
        EXCEPTION WHEN query_canceled THEN
            PERFORM pg_advisory_unlock(fence + extract(epoch FROM previous)::bigint);
            RAISE;
        END;
        PERFORM set_config('payauth.closed_period', previous::text, false);
    END IF;
    PERFORM set_config('payauth.claim_period', period::text, true);
    RETURN period;
END
$$;

REVOKE ALL ON FUNCTION payauth_claim_period FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_claim_period TO payauth_worker;
