-- Migration 019's checks validated: a scan of each table under SHARE UPDATE EXCLUSIVE, which
-- lets the workers go on writing meanwhile (in a migration of its own: 019's exclusive lock
-- is let go first).
ALTER TABLE accounts VALIDATE CONSTRAINT accounts_account_id_check;
ALTER TABLE holds VALIDATE CONSTRAINT holds_txn_id_check;
ALTER TABLE processed_transactions VALIDATE CONSTRAINT processed_transactions_txn_id_check;
