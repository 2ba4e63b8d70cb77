-- payauth_limits_give_back: what a reversal gives back to the limits that counted its
-- original (a purchase, or a hold with its increments): in each limit, up to what it
-- released or credited, taken from the charges kept under the original (the increments'
-- first, the latest period first), never more than they counted. A full reversal gives the
-- counts back too: in each limit where nothing counted under the original is left, once
-- the original is no hold that stands (a purchase; a hold reversed whole, by this reversal
-- or, in a batch, by a later one of it); a partial one keeps them, even when it takes an
-- increment's whole amount back (the authorization stands, counted or not: a limit loaded
-- after it, or its charge purged with its dedup period, left the increments' charges
-- alone). Called by the batch statement's routes in the reversal's
-- transaction, with the original's account locked. Clearings and expiry give nothing back:
-- what was spent stays spent, and a hold that expires was approved.
CREATE OR REPLACE FUNCTION payauth_limits_give_back(
    p_original text,     -- the purchase or hold the reversal names
    p_released numeric   -- what it released or credited, in the account's currency
) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    c     record;
    lim   text;
    left_ numeric;
    take  numeric;
BEGIN
    IF p_released IS NULL OR p_released <= 0 THEN
        RETURN;
    END IF;
    FOR c IN SELECT * FROM limit_charges
              WHERE txn_id = p_original AND amount > 0
              ORDER BY limit_id, charged_by = txn_id, period_start DESC, charged_by DESC
                FOR UPDATE LOOP
        IF lim IS DISTINCT FROM c.limit_id THEN
            lim := c.limit_id; left_ := p_released;
        END IF;
        take := least(left_, c.amount);
        CONTINUE WHEN take <= 0;
        UPDATE limit_charges SET amount = amount - take
         WHERE txn_id = c.txn_id AND limit_id = c.limit_id AND charged_by = c.charged_by;
        UPDATE limit_usage SET amount = amount - take
         WHERE limit_id = c.limit_id AND period_start = c.period_start;
        left_ := left_ - take;
    END LOOP;
    -- (A hold is read as the batch leaves it, under its account's lock: one a clearing or
    -- an expiry ended was spent, one still active stands.)
    IF EXISTS (SELECT 1 FROM holds h WHERE h.txn_id = p_original AND h.state <> 'REVERSED')
    THEN
        RETURN;
    END IF;
    -- (The charges under the original are locked above, those with an amount left; the
    -- ones given back whole before are read here under the original's account lock.)
    FOR c IN SELECT * FROM limit_charges x
              WHERE x.txn_id = p_original AND x.count > 0
                AND NOT EXISTS (SELECT 1 FROM limit_charges y
                                 WHERE y.txn_id = p_original AND y.limit_id = x.limit_id
                                   AND y.amount > 0)
                FOR UPDATE LOOP
        UPDATE limit_charges SET count = 0
         WHERE txn_id = c.txn_id AND limit_id = c.limit_id AND charged_by = c.charged_by;
        UPDATE limit_usage SET count = count - c.count
         WHERE limit_id = c.limit_id AND period_start = c.period_start;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_limits_give_back FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limits_give_back TO payauth_worker;
