-- The dedup store partitioned by period (a UTC day, dedup_period), so that `payauth purge`
-- drops a whole day past the retention window instead of deleting it row by row
-- (sql/payauth_dedup_drop_period.sql); docs/operations.md tells an operator.
--
-- The upgrade keeps every record without copying one: today's table becomes the partition
-- of every period before today ("before periods"), each of its records in the period just
-- before the upgrade's day (so a claim on the upgrade's day, which probes the period before
-- its own, still meets a record a stale lookup missed); it goes whole, like any period,
-- once its last record is past the window. A default partition keeps what no period's
-- partition holds yet (an insert before sql/payauth_dedup_prepare.sql made its day).
--
-- A primary key of a partitioned table includes its partition key: (txn_id,
-- dedup_period) makes a claim unique within a period; across periods, the claim's fence
-- does (sql/payauth_claim_period.sql).
DO $$
DECLARE
    upgrade_day date := (now() AT TIME ZONE 'UTC')::date;
BEGIN
    LOCK TABLE processed_transactions IN ACCESS EXCLUSIVE MODE;
    ALTER TABLE processed_transactions RENAME TO processed_transactions_before_periods;
    ALTER TABLE processed_transactions_before_periods
        DROP CONSTRAINT processed_transactions_pkey;
    ALTER INDEX processed_transactions_processed_at_idx
        RENAME TO processed_transactions_before_periods_processed_at_idx;
    -- (A default evaluated once: the column is added without rewriting the table.)
    EXECUTE format('ALTER TABLE processed_transactions_before_periods '
                   'ADD COLUMN dedup_period date NOT NULL DEFAULT %L', upgrade_day - 1);
    ALTER TABLE processed_transactions_before_periods ALTER COLUMN dedup_period DROP DEFAULT;

    CREATE TABLE processed_transactions (
        LIKE processed_transactions_before_periods INCLUDING CONSTRAINTS INCLUDING STORAGE
    ) PARTITION BY RANGE (dedup_period);
    -- An insert naming only the contract's columns lands in the day it is made.
    ALTER TABLE processed_transactions
        ALTER COLUMN dedup_period SET DEFAULT (now() AT TIME ZONE 'UTC')::date;
    ALTER TABLE processed_transactions ADD PRIMARY KEY (txn_id, dedup_period);
    CREATE INDEX processed_transactions_processed_at_idx
        ON processed_transactions (processed_at);
    -- The records an administrator set before their own period: the only ones the purge
    -- deletes row by row (the rest go with their period).
    CREATE INDEX processed_transactions_set_back_idx ON processed_transactions (processed_at)
     WHERE processed_at < (dedup_period::timestamp AT TIME ZONE 'UTC');
    IF EXISTS (SELECT 1 FROM processed_transactions_before_periods) THEN
        EXECUTE format('ALTER TABLE processed_transactions ATTACH PARTITION '
                       'processed_transactions_before_periods '
                       'FOR VALUES FROM (MINVALUE) TO (%L)', upgrade_day);
        -- (The worker's gauge counts a partition never analyzed on its own.)
        REVOKE ALL ON processed_transactions_before_periods FROM payauth_worker;
        GRANT SELECT ON processed_transactions_before_periods TO payauth_worker;
    ELSE  -- (a new store: nothing to keep)
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
