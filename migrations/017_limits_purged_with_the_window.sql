-- payauth purge removes the spending limits' bookkeeping past the retention window too: the
-- charges kept under a dedup record it deletes, and the usage of periods over before the
-- window (service/adapters/retention.py). The worker purges now and then with its own role.
GRANT DELETE ON limit_charges, limit_usage TO payauth_worker;
