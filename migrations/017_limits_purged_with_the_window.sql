-- payauth purge removes the spending limits' charges kept under the dedup records it
-- deletes (service/adapters/retention.py); the worker purges now and then with its own role.
GRANT DELETE ON limit_charges TO payauth_worker;
