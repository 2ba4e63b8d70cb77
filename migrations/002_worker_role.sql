-- A least-privilege role for the worker. Operators create a login user and grant it:
--   CREATE ROLE payauth_app LOGIN PASSWORD '…' IN ROLE payauth_worker;
-- The worker may read accounts and move balances, append ledger entries and dedup records,
-- confirm publication and purge expired dedup records. It may not update or delete ledger
-- entries, open accounts, or change the schema (migrations run under another role).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'payauth_worker') THEN
        CREATE ROLE payauth_worker NOLOGIN;
    END IF;
END
$$;

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM payauth_worker;
REVOKE CREATE ON SCHEMA public FROM payauth_worker;
GRANT USAGE ON SCHEMA public TO payauth_worker;

GRANT SELECT ON accounts TO payauth_worker;
GRANT UPDATE (balance, updated_at) ON accounts TO payauth_worker;

GRANT SELECT, INSERT ON ledger_entries TO payauth_worker;

GRANT SELECT, INSERT, DELETE ON processed_transactions TO payauth_worker;
GRANT UPDATE (published_at) ON processed_transactions TO payauth_worker;
