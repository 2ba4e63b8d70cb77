-- The ledger's and the holds' foreign keys to accounts checked every row the authorize path
-- writes (a trigger, a query and a row lock on an account the batch has locked already); a
-- large share of PostgreSQL's CPU per authorization (docs/benchmark.md, "Design figures").
-- What they guaranteed, that every ledger entry and hold names an account that exists, now
-- holds by:
--   * the writers: payauth_authorize's routes write a ledger entry or a hold only for an
--     account they locked FOR UPDATE in the same transaction (sql/payauth_authorize.sql);
--   * an account with a ledger entry or a hold is never deleted, renamed or truncated away:
--     the triggers below (sql/payauth_account_keeps_history.sql), as the keys' ON DELETE NO
--     ACTION refused it;
--   * `payauth verify`: "every ledger entry and hold names an account".
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_account_id_fkey;
ALTER TABLE holds DROP CONSTRAINT holds_account_id_fkey;

-- The triggers need their function to exist: a stand-in that refuses, replaced by its one
-- definition, sql/payauth_account_keeps_history.sql, which `payauth migrate` applies right
-- after the migrations (until then an account cannot be deleted at all: it fails closed).
CREATE OR REPLACE FUNCTION payauth_account_keeps_history() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'payauth_account_keeps_history is defined by sql/ (payauth migrate)'
          USING ERRCODE = 'foreign_key_violation';
END
$$;

CREATE TRIGGER accounts_keep_history_on_delete
    BEFORE DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION payauth_account_keeps_history();
-- Only an UPDATE that names account_id fires it: the authorize path's UPDATEs do not.
CREATE TRIGGER accounts_keep_history_on_rename
    BEFORE UPDATE OF account_id ON accounts
    FOR EACH ROW WHEN (OLD.account_id IS DISTINCT FROM NEW.account_id)
    EXECUTE FUNCTION payauth_account_keeps_history();
CREATE TRIGGER accounts_keep_history_on_truncate
    BEFORE TRUNCATE ON accounts
    FOR EACH STATEMENT EXECUTE FUNCTION payauth_account_keeps_history();
