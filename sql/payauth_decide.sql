-- payauth_decide: the decision rule, alone. Pure, no table read: given what a decision
-- read (the account's available balance, NULL when there is no such account, its status
-- and currency) and the request, 'APPROVED' or the decline reason. The batch statements
-- call it for each message; `payauth replay --shadow` calls it on the inputs stored with
-- each decision. Its version (payauth_rule_version) is the md5 of its source: a change here
-- is a new rule version with nothing to bump by hand.
--
-- PURCHASE and REFUND: account, status, currency, funds (a REFUND needs none). REVERSAL is
-- never declined (what it releases is capped by what remains). ADVICE and CLEARING are
-- never declined past the available balance nor for the account's status, only for an
-- unknown account or another currency than the account's (a hold or a posting in another
-- currency cannot be netted against it; payauth_mismatch dead-letters those as
-- LIFECYCLE_MISMATCH before the rule is asked).
--
-- A one-expression SQL function: the planner inlines it into the callers' loops.
CREATE OR REPLACE FUNCTION payauth_decide(
    balance          numeric,  -- the account's available balance; NULL: no such account
    status           text,
    account_currency text,
    currency         text,     -- the request's
    auth_type        text,
    amount           numeric
) RETURNS text  -- 'APPROVED' or the decline reason
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN auth_type = 'REVERSAL' THEN 'APPROVED'
        WHEN balance IS NULL THEN 'UNKNOWN_ACCOUNT'
        WHEN auth_type IN ('ADVICE', 'CLEARING') AND account_currency = currency
            THEN 'APPROVED'
        WHEN status <> 'ACTIVE' THEN 'ACCOUNT_BLOCKED'
        WHEN account_currency <> currency THEN 'CURRENCY_MISMATCH'
        WHEN auth_type = 'REFUND' THEN 'APPROVED'
        WHEN balance < amount THEN 'INSUFFICIENT_FUNDS'
        ELSE 'APPROVED'
    END
$$;

REVOKE ALL ON FUNCTION payauth_decide FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_decide TO payauth_worker;
