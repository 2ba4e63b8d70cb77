-- payauth_account_amount: what a message moves, in its account's currency: its amount when
-- it is in the account's currency; else the network's conversion (billing_amount) when that
-- is in the account's currency; else NULL (a kind that may be declined is declined
-- CURRENCY_MISMATCH, one that may not is dead-lettered LIFECYCLE_MISMATCH). The rate is the
-- message's: nothing is looked up. Part of the rule's version (payauth_rule_version).
CREATE OR REPLACE FUNCTION payauth_account_amount(
    account_currency text,
    currency         text,     -- the message's
    amount           numeric,
    billing_currency text,     -- the network's conversion, when it sent one
    billing_amount   numeric
) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN account_currency = currency THEN amount
                WHEN account_currency = billing_currency THEN billing_amount END
$$;

REVOKE ALL ON FUNCTION payauth_account_amount FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_account_amount TO payauth_worker;
