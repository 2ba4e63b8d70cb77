-- The dedup store partitioned by period, so that `payauth purge` drops a whole period past
-- the retention window instead of deleting it row by row (sql/payauth_dedup_drop_period.sql);
-- docs/operations.md tells an operator.
--
-- A period is dedup_store.period_seconds long (a day unless the store was made with another,
-- sql/payauth_dedup_set_period.sql), counted from the Unix epoch (so a day is a UTC day).
-- processed_transactions.dedup_period is a time within its record's period: a claim writes
-- its period's start (sql/payauth_dedup_period.sql); an insert naming only the contract's
-- columns gets the time it is made.
--
-- The upgrade keeps every record without copying one: the table of before becomes the
-- partition of every time before the upgrade's period ("before periods"), each of its records
-- in the period just before the upgrade's (so a claim in the upgrade's period, which probes the
-- period before its own, still meets a record a stale lookup missed); it goes whole, like any
-- period, once its last record is past the window. (A new store has no such partition.) A
-- default partition keeps what no period's partition holds yet (sql/payauth_dedup_prepare.sql
-- makes them ahead).
--
-- A primary key of a partitioned table includes its partition key: (txn_id,
-- dedup_period) makes a claim unique within a period; across periods, the claim's fence
-- does (sql/payauth_claim_period.sql).
CREATE TABLE dedup_store (
    one            boolean PRIMARY KEY DEFAULT true CHECK (one),
    period_seconds integer NOT NULL DEFAULT 86400 CHECK (period_seconds BETWEEN 60 AND 604800)
);
INSERT INTO dedup_store DEFAULT VALUES;
GRANT SELECT ON dedup_store TO payauth_worker;

DO $$
DECLARE
    -- The day under way (UTC), and the one before: the records of before are kept in it.
    upgrade_period timestamptz := date_trunc('day', now(), 'UTC');
BEGIN
    LOCK TABLE processed_transactions IN ACCESS EXCLUSIVE MODE;
    ALTER TABLE processed_transactions RENAME TO processed_transactions_before_periods;
    ALTER TABLE processed_transactions_before_periods
        DROP CONSTRAINT processed_transactions_pkey;
    ALTER INDEX processed_transactions_processed_at_idx
        RENAME TO processed_transactions_before_periods_processed_at_idx;
    -- (A default evaluated once: the column is added without rewriting the table.)
    EXECUTE format('ALTER TABLE processed_transactions_before_periods '
                   'ADD COLUMN dedup_period timestamptz NOT NULL DEFAULT %L',
                   upgrade_period - interval '1 day');
    ALTER TABLE processed_transactions_before_periods ALTER COLUMN dedup_period DROP DEFAULT;

    CREATE TABLE processed_transactions (
        LIKE processed_transactions_before_periods INCLUDING CONSTRAINTS INCLUDING STORAGE
    ) PARTITION BY RANGE (dedup_period);
    ALTER TABLE processed_transactions ALTER COLUMN dedup_period SET DEFAULT now();
    ALTER TABLE processed_transactions ADD PRIMARY KEY (txn_id, dedup_period);
    CREATE INDEX processed_transactions_processed_at_idx
        ON processed_transactions (processed_at);
    -- The records set before their own period (an administrator's UPDATE of processed_at):
    -- the only ones the purge deletes row by row (the rest go with their period).
    CREATE INDEX processed_transactions_set_back_idx ON processed_transactions (processed_at)
     WHERE processed_at < dedup_period;
    IF EXISTS (SELECT 1 FROM processed_transactions_before_periods) THEN
        EXECUTE format('ALTER TABLE processed_transactions ATTACH PARTITION '
                       'processed_transactions_before_periods '
                       'FOR VALUES FROM (MINVALUE) TO (%L)', upgrade_period);
        -- (The worker's gauge counts a partition never analyzed on its own.)
        REVOKE ALL ON processed_transactions_before_periods FROM payauth_worker;
        GRANT SELECT ON processed_transactions_before_periods TO payauth_worker;
    ELSE
        DROP TABLE processed_transactions_before_periods;
    END IF;
    CREATE TABLE processed_transactions_default PARTITION OF processed_transactions DEFAULT;
END
$$;

GRANT SELECT, INSERT, DELETE ON processed_transactions TO payauth_worker;
GRANT UPDATE (published_at) ON processed_transactions TO payauth_worker;
-- The purge deletes the default partition's records past the window by its own index (and
-- the worker's gauge counts it while it was never analyzed).
GRANT SELECT, DELETE ON processed_transactions_default TO payauth_worker;
GRANT UPDATE (published_at) ON processed_transactions_default TO payauth_worker;
