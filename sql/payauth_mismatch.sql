-- payauth_mismatch: why a message cannot be decided at all, or NULL. Such a message is not
-- claimed and changes nothing: the worker dead-letters it LIFECYCLE_MISMATCH with this text
-- as the detail, and a redrive decides it once what it names is put right.
--
-- * A REVERSAL or CLEARING whose original is known and is a REFUND, REVERSAL or CLEARING,
--   or is of another account or currency; a CLEARING of a PURCHASE (posted already).
-- * An ADVICE or CLEARING in another currency than its account's (it moves money whatever
--   the funds: it cannot be netted), or a CLEARING of an unknown account (nothing to post
--   to; an ADVICE of one is declined UNKNOWN_ACCOUNT by payauth_decide, as the contract
--   says).
--
-- An original not known yet is no mismatch (a REVERSAL waits for it, a CLEARING is forced).
-- Read-only: payauth_authorize_each asks it for each message of the batch it decides (the
-- messages before it in the batch already written), `payauth replay --shadow` for each
-- message never decided.
CREATE OR REPLACE FUNCTION payauth_mismatch(
    p_kind     text,
    p_account  text,
    p_currency text,
    p_original text
) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    orig_type text;
    orig_acct text;
    orig_cur  text;
    acct_cur  text;
BEGIN
    IF p_original IS NOT NULL THEN
        -- What the original is: a hold, a posting, a decided message of another kind.
        SELECT h.kind, h.account_id, h.currency::text INTO orig_type, orig_acct, orig_cur
          FROM holds h WHERE h.txn_id = p_original;
        IF NOT FOUND THEN
            SELECT l.type, l.account_id, l.currency::text INTO orig_type, orig_acct, orig_cur
              FROM ledger_entries l WHERE l.txn_id = p_original;
        END IF;
        IF orig_type IS NULL THEN
            SELECT m.kind, m.account_id, m.currency::text INTO orig_type, orig_acct, orig_cur
              FROM lifecycle_messages m WHERE m.txn_id = p_original;
        END IF;
        IF orig_type IS NULL THEN
            SELECT p.authorization_type, p.account_id, p.currency::text
              INTO orig_type, orig_acct, orig_cur
              FROM processed_transactions p WHERE p.txn_id = p_original;
        END IF;
        IF orig_type IN ('REFUND', 'REVERSAL', 'CLEARING') THEN
            RETURN format('the original %s is a %s', p_original, orig_type);
        ELSIF p_kind = 'CLEARING' AND orig_type = 'PURCHASE' THEN
            RETURN format('the original %s is a PURCHASE (posted already)', p_original);
        ELSIF orig_acct <> p_account THEN
            RETURN format('the original %s is of another account', p_original);
        ELSIF orig_cur <> p_currency THEN
            RETURN format('the original %s is in %s', p_original, orig_cur);
        END IF;
    END IF;
    IF p_kind IN ('ADVICE', 'CLEARING') THEN
        SELECT a.currency::text INTO acct_cur FROM accounts a WHERE a.account_id = p_account;
        IF NOT FOUND AND p_kind = 'CLEARING' THEN
            RETURN format('the account %s is unknown', p_account);
        ELSIF FOUND AND acct_cur <> p_currency THEN
            RETURN format('the account %s is in %s', p_account, acct_cur);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION payauth_mismatch FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_mismatch TO payauth_worker;
