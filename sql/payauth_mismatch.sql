-- payauth_mismatch: why a message cannot be decided at all, or NULL. Such a message is not
-- claimed and changes nothing: the worker dead-letters it LIFECYCLE_MISMATCH with this text
-- as the detail, and a redrive decides it once what it names is put right.
--
-- * A REVERSAL or CLEARING whose original is known and is no hold nor purchase (a REFUND,
--   REVERSAL, CLEARING, INCREMENTAL, VERIFICATION or BALANCE_INQUIRY), or is of another
--   account; a CLEARING of a PURCHASE (posted already).
-- * An ADVICE, REVERSAL or CLEARING of a known account with no amount in its currency
--   (payauth_account_amount: neither the amount nor the network's billing amount is in
--   the account's currency): it moves money whatever the funds and cannot be netted.
-- * A CLEARING of an unknown account (nothing to post to; an ADVICE of one is declined
--   UNKNOWN_ACCOUNT by payauth_decide, as the contract says; a REVERSAL of one waits as an
--   orphan for its original to say which account it is).
--
-- An original not known yet is no mismatch (a REVERSAL waits for it, a CLEARING is forced
-- and kept for it). The kinds that may be declined are never mismatched: their decline
-- says it (CURRENCY_MISMATCH, HOLD_NOT_ACTIVE). Read-only: payauth_authorize_each asks it
-- for each message of the batch it decides (the messages before it in the batch already
-- written), `payauth replay --shadow` for each message never decided.
CREATE OR REPLACE FUNCTION payauth_mismatch(
    p_kind             text,
    p_account          text,
    p_currency         text,
    p_amount           numeric,
    p_billing_currency text,
    p_billing_amount   numeric,
    p_original         text
) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    orig_type text;
    orig_acct text;
    acct_cur  text;
BEGIN
    IF p_kind NOT IN ('ADVICE', 'REVERSAL', 'CLEARING') THEN
        RETURN NULL;
    END IF;
    IF p_original IS NOT NULL THEN
        -- What the original is: a hold, a posting, a decided message of another kind.
        SELECT h.kind, h.account_id INTO orig_type, orig_acct
          FROM holds h WHERE h.txn_id = p_original;
        IF NOT FOUND THEN
            SELECT l.type, l.account_id INTO orig_type, orig_acct
              FROM ledger_entries l WHERE l.txn_id = p_original;
        END IF;
        IF orig_type IS NULL THEN
            SELECT m.kind, m.account_id INTO orig_type, orig_acct
              FROM lifecycle_messages m WHERE m.txn_id = p_original;
        END IF;
        IF orig_type IS NULL THEN
            SELECT p.authorization_type, p.account_id INTO orig_type, orig_acct
              FROM processed_transactions p WHERE p.txn_id = p_original;
        END IF;
        IF orig_type NOT IN ('PURCHASE', 'AUTHORIZATION', 'ADVICE') THEN
            RETURN format('the original %s is a %s', p_original, orig_type);
        ELSIF p_kind = 'CLEARING' AND orig_type = 'PURCHASE' THEN
            RETURN format('the original %s is a PURCHASE (posted already)', p_original);
        ELSIF orig_acct <> p_account THEN
            RETURN format('the original %s is of another account', p_original);
        END IF;
    END IF;
    SELECT a.currency::text INTO acct_cur FROM accounts a WHERE a.account_id = p_account;
    IF NOT FOUND THEN
        IF p_kind = 'CLEARING' THEN
            RETURN format('the account %s is unknown', p_account);
        END IF;
        RETURN NULL;
    END IF;
    IF payauth_account_amount(acct_cur, p_currency, p_amount, p_billing_currency,
                              p_billing_amount) IS NULL THEN
        RETURN format('the account %s is in %s: no billing_amount in %s', p_account,
                      acct_cur, acct_cur);
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION payauth_mismatch FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_mismatch TO payauth_worker;
