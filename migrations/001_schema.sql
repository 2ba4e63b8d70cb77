-- The authorization store. The schema enforces what it can on its own, so a bug in the
-- worker cannot write money that does not add up:
--  * one dedup record and at most one ledger entry per transaction_id (unique txn_id);
--  * amounts finite and non-zero: numeric accepts 'NaN', which sorts above every number, so
--    "amount > 0" alone lets NaN in; we exclude it (and Infinity) explicitly and bound the
--    size to what the service validates (15 integer digits, 4 decimals);
--  * balances never negative; currency codes are three upper-case letters.

CREATE TABLE accounts (
    account_id      text PRIMARY KEY CHECK (account_id ~ '^[!-~]{1,64}$'),
    balance         numeric NOT NULL
                    CHECK (balance <> 'NaN' AND balance <> 'Infinity' AND balance >= 0),
    -- What the account held before payauth touched it: verify checks
    -- balance = opening_balance + sum(ledger).
    opening_balance numeric NOT NULL
                    CHECK (opening_balance <> 'NaN' AND opening_balance <> 'Infinity'
                           AND opening_balance >= 0),
    currency        char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status          text NOT NULL DEFAULT 'ACTIVE' CHECK (status IN ('ACTIVE', 'BLOCKED', 'CLOSED')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Never purged: the ledger's unique txn_id is the last guard against a second debit, also
-- for a transaction replayed after its dedup record has expired.
CREATE TABLE ledger_entries (
    entry_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    txn_id     text NOT NULL UNIQUE,
    account_id text NOT NULL REFERENCES accounts (account_id),
    amount     numeric NOT NULL
               CHECK (amount <> 'NaN' AND amount <> 0 AND abs(amount) <= 999999999999999
                      AND scale(amount) <= 4),
    currency   char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    type       text NOT NULL CHECK (type IN ('PURCHASE', 'REFUND')),
    created_at timestamptz NOT NULL,
    -- Debits are negative, credits positive.
    CHECK ((type = 'PURCHASE' AND amount < 0) OR (type = 'REFUND' AND amount > 0))
);
CREATE INDEX ledger_entries_account_idx ON ledger_entries (account_id);

-- The dedup record: one row per decided transaction_id, with the result to answer again on
-- redelivery and the payload fingerprint that tells a duplicate from a conflict.
CREATE TABLE processed_transactions (
    txn_id             text PRIMARY KEY CHECK (txn_id ~ '^[!-~]{1,64}$'),
    processed_at       timestamptz NOT NULL,
    result             text NOT NULL CHECK (result IN ('APPROVED', 'DECLINED')),
    decline_reason     text CHECK (decline_reason IN ('INSUFFICIENT_FUNDS', 'UNKNOWN_ACCOUNT',
                                                      'CURRENCY_MISMATCH', 'ACCOUNT_BLOCKED')),
    fingerprint        text NOT NULL,
    account_id         text NOT NULL,
    amount             numeric NOT NULL
                       CHECK (amount <> 'NaN' AND amount > 0 AND amount <= 999999999999999),
    currency           char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    authorization_type text NOT NULL CHECK (authorization_type IN ('PURCHASE', 'REFUND')),
    correlation_id     text,
    message_id         text,
    source_topic       text,
    source_partition   integer,
    source_offset      bigint,
    -- Set once the result event was acknowledged by Kafka; a duplicate of a row still NULL
    -- here publishes the stored result again (same event_id).
    published_at       timestamptz,
    CHECK ((result = 'APPROVED') = (decline_reason IS NULL))
);
CREATE INDEX processed_transactions_processed_at_idx ON processed_transactions (processed_at);
