-- The functions and views now live in sql/, one file each, applied by `payauth migrate`
-- after the migrations (service/ops/migrate.py). What no file defines any more goes:
--
-- * payauth_authorize of 13 arguments, the entry point of purchase batches (011): the
--   entry point for every batch is now payauth_authorize with each message's original
--   (sql/payauth_authorize.sql), which chooses the route once, after locking the accounts.
-- * payauth_lifecycle (012) and payauth_lifecycle_each (011): the lifecycle's set-based
--   path and its loop, each of which chose a route too; now payauth_authorize_lifecycle
--   and payauth_authorize_each, which the entry point calls.
--
-- A worker of an earlier version still running calls a function that is gone: PostgreSQL
-- refuses the call, the worker pauses its partitions and commits nothing (the database is
-- "not answering" for it) until it is replaced.
DROP FUNCTION IF EXISTS payauth_authorize(text[], text[], numeric[], text[], text[], text[],
                                          text[], text[], integer[], bigint[], timestamptz,
                                          text, uuid);
DROP FUNCTION IF EXISTS payauth_lifecycle(text[], text[], numeric[], text[], text[], text[],
                                          text[], text[], integer[], bigint[], timestamptz,
                                          text, uuid, text[]);
DROP FUNCTION IF EXISTS payauth_lifecycle_each(text[], text[], numeric[], text[], text[],
                                               text[], text[], text[], integer[], bigint[],
                                               timestamptz, text, uuid, text[]);
-- The orphan reversals a decided original applied, found by the original: for their
-- ReversalApplied events when the original's event is published again, for `payauth
-- explain` and `payauth verify`. (The partial index on the waiting ones stays: the batch
-- statement probes it for every batch.)
CREATE INDEX orphan_reversals_original_idx ON orphan_reversals (original_txn_id);
