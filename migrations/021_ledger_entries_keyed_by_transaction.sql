-- A ledger entry is its transaction's: txn_id is unique (the contract's key, what the writers
-- claim with ON CONFLICT (txn_id)). The surrogate entry_id beside it cost a sequence value and
-- a second unique index on every entry written (PostgreSQL's CPU per authorization about 7 %
-- lower without them, paired: docs/benchmark.md, "Design figures"). An account's entries are
-- in the order of their created_at (the batch's time), then of their transaction_id.
-- (Dropping a column rewrites nothing: its values stay in the rows, unread, until each row is
-- next written.)
ALTER TABLE ledger_entries DROP COLUMN entry_id;
