-- payauth_limits_charge: count approved messages in the limits that count them, in the
-- decision's transaction: one charge per (message, limit with a period), kept under the
-- purchase or hold a reversal would name (an INCREMENTAL's: its hold's), and each limit's
-- usage in its period raised by the sum. Each charge is stamped with the dedup store's
-- period the batch claims in (payauth_claim_period), that of the counted message's record:
-- the purge drops the charge with that period (a standing hold's goes with a later one,
-- payauth_dedup_drop_period). Called by the batch statement's routes,
-- after the batch's claims, with the accounts locked: a limit's usage is written only
-- under the lock of its account, so two batches never count one limit at once. A charge
-- written twice (a message counted twice) is a unique violation: payauth_authorize answers
-- that message's claim lost where another transaction decided it, and refuses the whole
-- batch where not.
CREATE OR REPLACE FUNCTION payauth_limits_charge(
    p_under         text[],     -- the purchase or hold each charge is kept under
    p_charged_by    text[],     -- the message counted
    p_limit_ids     text[],
    p_period_starts date[],     -- NULL: a TRANSACTION limit, which counts nothing
    p_amounts       numeric[]   -- what was approved, in the account's currency
) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    claim_period constant timestamptz := payauth_claim_period();
BEGIN
    INSERT INTO limit_charges (txn_id, charged_by, limit_id, period_start, amount, count,
                               dedup_period)
    SELECT c.under, c.msg, c.lim, c.start, c.amount, 1, claim_period
      FROM unnest(p_under, p_charged_by, p_limit_ids, p_period_starts, p_amounts)
           AS c(under, msg, lim, start, amount)
     WHERE c.start IS NOT NULL;
    INSERT INTO limit_usage (limit_id, period_start, amount, count)
    SELECT c.lim, c.start, sum(c.amount), count(*)
      FROM unnest(p_limit_ids, p_period_starts, p_amounts) AS c(lim, start, amount)
     WHERE c.start IS NOT NULL
     GROUP BY c.lim, c.start
     ORDER BY c.lim, c.start
        ON CONFLICT (limit_id, period_start) DO UPDATE
       SET amount = limit_usage.amount + excluded.amount,
           count = limit_usage.count + excluded.count;
END
$$;

REVOKE ALL ON FUNCTION payauth_limits_charge FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limits_charge TO payauth_worker;
