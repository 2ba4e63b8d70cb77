-- The identifier checks said '^[!-~]{1,64}$' (printable ASCII, no space, 1 to 64
-- characters). PostgreSQL's regular expressions expand a bounded repetition into as many
-- states as its bound: matching it cost about 4.5 µs a row, paid on every dedup record, and
-- on every balance change too (an UPDATE checks every CHECK constraint of its row) — about a
-- fifth of PostgreSQL's CPU per authorization (docs/benchmark.md, "Design figures"). The
-- same rule spelled as a length and an unbounded class costs a fifteenth of it: a character
-- of [!-~] is one byte, so its octets are its characters.
--
-- Added NOT VALID (no scan under this migration's exclusive lock: every row already met
-- the old check, which says the same); migration 020 validates them under a lock that lets
-- the workers write meanwhile.
ALTER TABLE accounts DROP CONSTRAINT accounts_account_id_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_account_id_check
    CHECK (octet_length(account_id) BETWEEN 1 AND 64 AND account_id ~ '^[!-~]+$') NOT VALID;

ALTER TABLE holds DROP CONSTRAINT holds_txn_id_check;
ALTER TABLE holds ADD CONSTRAINT holds_txn_id_check
    CHECK (octet_length(txn_id) BETWEEN 1 AND 64 AND txn_id ~ '^[!-~]+$') NOT VALID;

-- (A store upgraded by migration 018 keeps the table of before as a partition with its own
-- copy of the check: it goes with the parent's, so that the new one can take its name.)
ALTER TABLE processed_transactions DROP CONSTRAINT processed_transactions_txn_id_check;
ALTER TABLE IF EXISTS processed_transactions_before_periods
    DROP CONSTRAINT IF EXISTS processed_transactions_txn_id_check;
ALTER TABLE processed_transactions ADD CONSTRAINT processed_transactions_txn_id_check
    CHECK (octet_length(txn_id) BETWEEN 1 AND 64 AND txn_id ~ '^[!-~]+$') NOT VALID;
