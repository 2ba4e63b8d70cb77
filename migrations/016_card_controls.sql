-- Card controls and spending limits (CONTRACT.md, "Card controls and spending limits"): the
-- cards, their statuses and who changed them, the limits, the blocked categories and
-- countries, and the usage each limit has counted. The rules are in sql/
-- (payauth_card_verdict, payauth_decide, payauth_card_inputs, payauth_limit_slots,
-- payauth_limits_charge, payauth_limits_give_back and the batch statement's routes).

CREATE TABLE cards (
    card_id    text PRIMARY KEY CHECK (length(card_id) BETWEEN 1 AND 64),
    account_id text NOT NULL,
    status     text NOT NULL DEFAULT 'ACTIVE'
               CHECK (status IN ('ACTIVE', 'FROZEN', 'LOST', 'STOLEN', 'CLOSED')),
    expires_on date,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cards_account_idx ON cards (account_id);
-- The cards not ACTIVE (the worker's gauge), few among millions.
CREATE INDEX cards_not_active_idx ON cards (status) WHERE status <> 'ACTIVE';

-- Every status change made outside the stream: who asked (the person, and the database
-- login that wrote it), why, when (payauth cards status).
CREATE TABLE card_status_changes (
    change_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    card_id    text NOT NULL,
    old_status text NOT NULL,
    new_status text NOT NULL,
    reason     text NOT NULL CHECK (length(reason) > 0),
    changed_by text NOT NULL DEFAULT session_user,
    db_user    text NOT NULL DEFAULT session_user,
    changed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX card_status_changes_card_idx ON card_status_changes (card_id, changed_at);

CREATE TABLE spending_limits (
    limit_id          text PRIMARY KEY CHECK (length(limit_id) BETWEEN 1 AND 64),
    scope             text NOT NULL CHECK (scope IN ('CARD', 'ACCOUNT')),
    scope_id          text NOT NULL,
    period            text NOT NULL CHECK (period IN ('TRANSACTION', 'DAY', 'WEEK', 'MONTH')),
    max_amount        numeric CHECK (max_amount >= 0 AND max_amount <> 'NaN'),
    max_count         integer CHECK (max_count >= 0),
    merchant_category text CHECK (merchant_category ~ '^[0-9]{4}$'),
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (max_amount IS NOT NULL OR max_count IS NOT NULL)
);
CREATE INDEX spending_limits_scope_idx ON spending_limits (scope_id, scope);

CREATE TABLE card_blocks (
    scope    text NOT NULL CHECK (scope IN ('CARD', 'ACCOUNT')),
    scope_id text NOT NULL,
    kind     text NOT NULL CHECK (kind IN ('CATEGORY', 'COUNTRY')),
    value    text NOT NULL,
    PRIMARY KEY (scope_id, scope, kind, value)
);

-- What a limit has counted in a period (DAY, WEEK, MONTH: the period's first day, in
-- PAYAUTH_LIMITS_TIMEZONE; a TRANSACTION limit counts nothing). Written only by a batch
-- that holds the lock of the limit's account (a card's limit: its card's account).
CREATE TABLE limit_usage (
    limit_id     text NOT NULL,
    period_start date NOT NULL,
    amount       numeric NOT NULL DEFAULT 0 CHECK (amount >= 0),
    count        integer NOT NULL DEFAULT 0 CHECK (count >= 0),
    PRIMARY KEY (limit_id, period_start)
);
-- The limits nearest their ceiling, now (the worker's gauge): the periods under way only.
CREATE INDEX limit_usage_period_idx ON limit_usage (period_start);

-- What each approved message counted in each limit, under the purchase or hold a reversal
-- names (txn_id: an INCREMENTAL's is its hold's), so that a reversal gives back exactly
-- what was counted: amount falls by what it released, count by one when nothing is left.
-- Kept as long as the holds are.
CREATE TABLE limit_charges (
    txn_id       text NOT NULL,
    charged_by   text NOT NULL,  -- the message that counted
    limit_id     text NOT NULL,
    period_start date NOT NULL,
    amount       numeric NOT NULL CHECK (amount >= 0),
    count        integer NOT NULL CHECK (count IN (0, 1)),
    PRIMARY KEY (txn_id, limit_id, charged_by)
);

-- What each decision read of the controls, beside what 007 and 014 keep (NULL where the
-- message had none): the message's own time (its headers.timestamp) and the fields that
-- name the card and the merchant's country and category; the card's status and expiry as
-- read (a NULL status with a card_id: no such card of the account); the blocks that
-- matched; each limit with its usage in the message's period; the limit a LIMIT_EXCEEDED
-- names.
ALTER TABLE processed_transactions
    ADD COLUMN message_time       timestamptz,
    ADD COLUMN card_id            text,
    ADD COLUMN merchant_category  text,
    ADD COLUMN merchant_country   text,
    ADD COLUMN input_card_status  text,
    ADD COLUMN input_card_expires date,
    ADD COLUMN input_blocks       text[],
    ADD COLUMN input_limits       jsonb,
    ADD COLUMN limit_id           text,
    DROP CONSTRAINT processed_transactions_decline_reason_check,
    ADD CONSTRAINT processed_transactions_decline_reason_check
        CHECK (decline_reason IN ('INSUFFICIENT_FUNDS', 'UNKNOWN_ACCOUNT', 'CURRENCY_MISMATCH',
                                  'ACCOUNT_BLOCKED', 'HOLD_NOT_ACTIVE', 'UNKNOWN_CARD',
                                  'CARD_BLOCKED', 'CARD_EXPIRED', 'CATEGORY_BLOCKED',
                                  'COUNTRY_BLOCKED', 'LIMIT_EXCEEDED'));

-- A hold some limit counted (its authorization or an increment of it): only its reversals
-- give back (payauth_limits_give_back), the others skip the look for charges.
ALTER TABLE holds ADD COLUMN limited boolean NOT NULL DEFAULT false;

GRANT SELECT ON cards, spending_limits, card_blocks TO payauth_worker;
GRANT UPDATE (limited) ON holds TO payauth_worker;
GRANT SELECT, INSERT, UPDATE ON limit_usage TO payauth_worker;
GRANT SELECT, INSERT, UPDATE ON limit_charges TO payauth_worker;

-- The rule takes the card's verdict and the limits' room; the batch statement and its
-- routes take the card, the merchant's country and category, the message's time and the
-- limits' time zone, and answer the card's status and a limit's id: other functions,
-- defined in sql/; these go.
DROP FUNCTION IF EXISTS payauth_decide(numeric, text, text, numeric, text, boolean);
DROP FUNCTION IF EXISTS payauth_authorize(text[], text[], numeric[], text[], text[], text[],
                                          text[], text[], integer[], bigint[], timestamptz,
                                          text, uuid, text[], numeric[], text[], boolean[],
                                          boolean[]);
DROP FUNCTION IF EXISTS payauth_authorize_purchases(text[], text[], numeric[], text[],
                                                    text[], text[], text[], text[],
                                                    integer[], bigint[], timestamptz, text,
                                                    uuid, numeric[], text[], boolean[]);
DROP FUNCTION IF EXISTS payauth_authorize_lifecycle(text[], text[], numeric[], text[],
                                                    text[], text[], text[], text[],
                                                    integer[], bigint[], timestamptz, text,
                                                    uuid, text[], numeric[], text[],
                                                    boolean[], boolean[]);
DROP FUNCTION IF EXISTS payauth_authorize_each(text[], text[], numeric[], text[], text[],
                                               text[], text[], text[], integer[], bigint[],
                                               timestamptz, text, uuid, text[], numeric[],
                                               text[], boolean[], boolean[]);
