-- A write whose COMMIT waits for the synchronous standby (the worker's load_stored).
--
-- A decision can be visible on the primary before its synchronous standby has it (its
-- client cancelled the wait for replication; the primary restarted after a crash). Before
-- a worker publishes a stored decision never confirmed published, it commits one small
-- write: PostgreSQL waits for the standby only at the COMMIT of a transaction that wrote
-- WAL (an id alone, pg_current_xact_id(), does not), and the standby confirms the WAL in
-- order, so every commit before this one is on the standby when it returns.
--
-- Sixteen rows, one chosen by the backend's pid: workers rarely queue on the same row.
-- Updated in place (HOT), the table stays a few pages however often it is touched.
CREATE TABLE durability_barrier (
    slot       smallint PRIMARY KEY,
    touched_at timestamptz NOT NULL
);
INSERT INTO durability_barrier (slot, touched_at)
SELECT slot, now() FROM generate_series(0, 15) AS slot;

GRANT SELECT, UPDATE (touched_at) ON durability_barrier TO payauth_worker;
