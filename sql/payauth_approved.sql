-- payauth_approved: what a decision approves, in the account's currency: the whole amount,
-- or for a partial approval the available balance the decision read; NULL for a decline.
-- Debits, holds, reversals' caps and the events count from it. Part of the rule's version
-- (payauth_rule_version).
CREATE OR REPLACE FUNCTION payauth_approved(
    outcome text,     -- payauth_decide's
    amount  numeric,  -- in the account's currency (payauth_account_amount)
    balance numeric   -- the available balance the decision read
) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE outcome WHEN 'APPROVED' THEN amount WHEN 'PARTIAL' THEN balance END
$$;

REVOKE ALL ON FUNCTION payauth_approved FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_approved TO payauth_worker;
