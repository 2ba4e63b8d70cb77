-- The triggers accounts_keep_history_* (migration 015) call this before an account is
-- deleted, its account_id changed, or the table truncated. An account that a ledger entry
-- or a hold names keeps its row: what the two tables' foreign keys to accounts refused
-- (ON DELETE NO ACTION), without their check on every row the authorize path writes. Close
-- or block an account instead (status). The same SQLSTATE as the foreign keys answered.
-- (The writers need no check: payauth_authorize's routes write a ledger entry or a hold only
-- for an account they locked FOR UPDATE in the same transaction, which a DELETE waits for;
-- a DELETE that committed first leaves them no row to lock: UNKNOWN_ACCOUNT, nothing
-- written. `payauth verify` checks that every ledger entry and hold names an account.)
CREATE OR REPLACE FUNCTION payauth_account_keeps_history() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF EXISTS (SELECT 1 FROM ledger_entries) OR EXISTS (SELECT 1 FROM holds) THEN
            RAISE EXCEPTION 'accounts cannot be truncated while ledger entries or holds '
                            'name them' USING ERRCODE = 'foreign_key_violation';
        END IF;
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM ledger_entries WHERE account_id = OLD.account_id)
       OR EXISTS (SELECT 1 FROM holds WHERE account_id = OLD.account_id) THEN
        RAISE EXCEPTION 'account % has ledger entries or holds: it is kept (block it instead)',
                        OLD.account_id USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
