-- An issuer's whole day (CONTRACT.md, "An issuer's whole day"): zero-amount verifications and
-- balance inquiries, increments of a hold, partial approvals, conversions into the account's
-- currency, several clearings for one hold, a clearing before its hold. The tables they need;
-- the rules are in sql/ (payauth_decide, payauth_account_amount, payauth_approved and the
-- batch statement's routes).

-- The new kinds; a zero amount for the two that carry none.
ALTER TABLE processed_transactions
    DROP CONSTRAINT processed_transactions_authorization_type_check,
    ADD CONSTRAINT processed_transactions_authorization_type_check
        CHECK (authorization_type IN ('PURCHASE', 'REFUND', 'AUTHORIZATION', 'ADVICE',
                                      'REVERSAL', 'CLEARING', 'VERIFICATION',
                                      'BALANCE_INQUIRY', 'INCREMENTAL')),
    DROP CONSTRAINT processed_transactions_amount_check,
    ADD CONSTRAINT processed_transactions_amount_check
        CHECK (amount <> 'NaN' AND amount >= 0 AND amount <= 999999999999999
               AND (amount > 0 OR authorization_type IN ('VERIFICATION', 'BALANCE_INQUIRY'))),
    DROP CONSTRAINT processed_transactions_decline_reason_check,
    ADD CONSTRAINT processed_transactions_decline_reason_check
        CHECK (decline_reason IN ('INSUFFICIENT_FUNDS', 'UNKNOWN_ACCOUNT', 'CURRENCY_MISMATCH',
                                  'ACCOUNT_BLOCKED', 'HOLD_NOT_ACTIVE'));

-- What each decision was asked and answered, beside what 007 keeps (NULL in earlier rows,
-- and where the message did not carry it): the network's conversion into the cardholder's
-- currency, whether the merchant accepts a partial approval, what was approved (in the
-- account's currency: the amount, the billing amount, or less for a partial approval), a
-- clearing's final flag, an increment's hold as its decision read it, an inquiry's ledger
-- balance (its available balance is input_balance), and what clearings had released of a
-- hold before it was placed. Columns without a default: adding them rewrites nothing.
ALTER TABLE processed_transactions
    ADD COLUMN billing_amount   numeric,
    ADD COLUMN billing_currency char(3),
    ADD COLUMN partial_ok       boolean,
    ADD COLUMN amount_approved  numeric,
    ADD COLUMN final            boolean,
    ADD COLUMN input_hold_state text,
    ADD COLUMN ledger_balance   numeric,
    ADD COLUMN already_cleared  numeric;

-- Increments are lifecycle messages: never purged, recognised after the dedup purge.
ALTER TABLE lifecycle_messages
    DROP CONSTRAINT lifecycle_messages_kind_check,
    ADD CONSTRAINT lifecycle_messages_kind_check
        CHECK (kind IN ('AUTHORIZATION', 'ADVICE', 'REVERSAL', 'CLEARING', 'INCREMENTAL')),
    ADD COLUMN final           boolean,
    ADD COLUMN amount_approved numeric;

-- A hold is what was approved (amount) and what its increments added (incremented); it
-- never keeps more than both.
ALTER TABLE holds
    ADD COLUMN incremented numeric NOT NULL DEFAULT 0 CHECK (incremented >= 0),
    DROP CONSTRAINT holds_check,
    ADD CONSTRAINT holds_remaining_check
        CHECK (remaining >= 0 AND remaining <= amount + incremented);

-- The request a ledger entry posts, when the entry alone does not say it (a partial
-- approval posts less than was asked, a conversion another currency): a redelivery after
-- the dedup purge is still recognised as the same request, not a conflict.
ALTER TABLE ledger_entries ADD COLUMN request_fingerprint text;

-- A CLEARING whose original is not known yet: posted at once (forced), and kept WAITING
-- until that AUTHORIZATION or ADVICE comes; then APPLIED (the hold placed holds only what
-- the clearings before it did not already release) or VOID (the original declined, or of
-- another account). Never purged, as orphan_reversals.
CREATE TABLE early_clearings (
    txn_id          text PRIMARY KEY,
    original_txn_id text NOT NULL,
    account_id      text NOT NULL,
    currency        char(3) NOT NULL,
    amount          numeric NOT NULL CHECK (amount > 0),  -- in the account's currency
    final           boolean NOT NULL,
    state           text NOT NULL CHECK (state IN ('WAITING', 'APPLIED', 'VOID')),
    applied         numeric,  -- what it released of the hold when the hold came
    arrived_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz
);
CREATE INDEX early_clearings_waiting_idx ON early_clearings (original_txn_id)
    WHERE state = 'WAITING';
CREATE INDEX early_clearings_original_idx ON early_clearings (original_txn_id);

GRANT UPDATE (incremented) ON holds TO payauth_worker;
GRANT SELECT, INSERT ON early_clearings TO payauth_worker;
GRANT UPDATE (state, applied, resolved_at) ON early_clearings TO payauth_worker;

-- The rule's new inputs (the amount in the account's currency, an increment's hold, the
-- partial approval's flag) make payauth_decide another function; sql/payauth_decide.sql
-- defines it, the one of 010 goes.
DROP FUNCTION IF EXISTS payauth_decide(numeric, text, text, text, text, numeric);

-- The batch statement and its routes take the new columns (the conversion, the partial
-- approval's flag, a clearing's final flag) and answer with more; payauth_mismatch takes
-- the conversion: other functions, defined in sql/; these go.
DROP FUNCTION IF EXISTS payauth_authorize(text[], text[], numeric[], text[], text[], text[],
                                          text[], text[], integer[], bigint[], timestamptz,
                                          text, uuid, text[]);
DROP FUNCTION IF EXISTS payauth_authorize_purchases(text[], text[], numeric[], text[],
                                                    text[], text[], text[], text[],
                                                    integer[], bigint[], timestamptz, text,
                                                    uuid);
DROP FUNCTION IF EXISTS payauth_authorize_lifecycle(text[], text[], numeric[], text[],
                                                    text[], text[], text[], text[],
                                                    integer[], bigint[], timestamptz, text,
                                                    uuid, text[]);
DROP FUNCTION IF EXISTS payauth_authorize_each(text[], text[], numeric[], text[], text[],
                                               text[], text[], text[], integer[], bigint[],
                                               timestamptz, text, uuid, text[]);
DROP FUNCTION IF EXISTS payauth_mismatch(text, text, text, text);
