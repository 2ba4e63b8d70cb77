-- The spending limits' charges partitioned as the dedup store is, by the period of the
-- counted message's record (dedup_period), each period's partition made with the store's
-- (sql/payauth_dedup_prepare.sql) and detached once the store's period is gone
-- (sql/payauth_limit_charges_drop_periods.sql), then summed into purged_limit_charges and
-- dropped outside the table (sql/payauth_dedup_drop_purged.sql): a period's charges
-- (two a purchase on a card with a daily and a monthly limit) were deleted row by row,
-- the work and the WAL that partitioning took away from the dedup records.
--
-- The upgrade keeps every charge without copying one: the table of before becomes the
-- partition of every period up to the end of the one under way (or of the latest period a
-- charge was counted in), and goes whole once the store has dropped them all. Its charges
-- counted before charges had a period (migration 022) take the period of the record of the
-- message they counted (the earliest time there is, where it is gone). (A new database has
-- no such partition.) A default partition keeps what no period's partition holds yet. The
-- upgrade reads the charges three times (the latest period, the bound, the primary key
-- built again) under a lock that holds the batches that count or give back a limit.
--
-- A primary key of a partitioned table includes its partition key: (txn_id, limit_id,
-- charged_by, dedup_period) keeps a charge from being written twice within a period; across
-- periods the claim does (a message is counted in the decision that claims it, once: the
-- claim's fence, sql/payauth_claim_period.sql). The period's BRIN index and the partial index
-- of the charges without a period go: the partition is the period now.
DO $$
DECLARE
    length interval := (SELECT make_interval(secs => period_seconds) FROM dedup_store);
    upto   timestamptz;
BEGIN
    LOCK TABLE limit_charges IN ACCESS EXCLUSIVE MODE;
    -- (The charges without a period found by the partial index that only they are in.)
    UPDATE limit_charges c
       SET dedup_period = coalesce((SELECT max(p.dedup_period)
                                      FROM processed_transactions p
                                     WHERE p.txn_id = c.charged_by), '-infinity')
     WHERE c.dedup_period IS NULL;
    DROP TRIGGER limit_charges_kept_when_purged ON limit_charges;
    DROP INDEX limit_charges_dedup_period_idx;
    DROP INDEX limit_charges_before_periods_idx;
    ALTER TABLE limit_charges RENAME TO limit_charges_before_periods;
    ALTER TABLE limit_charges_before_periods
        RENAME CONSTRAINT limit_charges_pkey TO limit_charges_before_periods_pkey;

    CREATE TABLE limit_charges (
        LIKE limit_charges_before_periods INCLUDING CONSTRAINTS INCLUDING STORAGE
    ) PARTITION BY RANGE (dedup_period);
    ALTER TABLE limit_charges ALTER COLUMN dedup_period SET NOT NULL;
    ALTER TABLE limit_charges ADD PRIMARY KEY (txn_id, limit_id, charged_by, dedup_period);

    IF EXISTS (SELECT 1 FROM limit_charges_before_periods) THEN
        -- (The end of the period under way, or of the latest one a charge names: every
        -- charge of before falls within the partition.)
        upto := to_timestamp((floor(extract(epoch FROM greatest(
                    now(), (SELECT max(dedup_period) FROM limit_charges_before_periods)))
                    / extract(epoch FROM length)) + 1) * extract(epoch FROM length));
        -- (One read of the charges proves the column NOT NULL and the partition's bound,
        -- so that neither is read for again; the primary key is built once more, with
        -- the period.)
        EXECUTE format('ALTER TABLE limit_charges_before_periods '
                       'ADD CONSTRAINT limit_charges_before_periods_bound '
                       'CHECK (dedup_period IS NOT NULL AND dedup_period < %L)', upto);
        ALTER TABLE limit_charges_before_periods ALTER COLUMN dedup_period SET NOT NULL;
        ALTER TABLE limit_charges_before_periods
            DROP CONSTRAINT limit_charges_before_periods_pkey,
            ADD CONSTRAINT limit_charges_before_periods_pkey
                PRIMARY KEY (txn_id, limit_id, charged_by, dedup_period);
        EXECUTE format('ALTER TABLE limit_charges ATTACH PARTITION '
                       'limit_charges_before_periods FOR VALUES FROM (MINVALUE) TO (%L)',
                       upto);
        ALTER TABLE limit_charges_before_periods
            DROP CONSTRAINT limit_charges_before_periods_bound;
        REVOKE ALL ON limit_charges_before_periods FROM payauth_worker;
    ELSE
        DROP TABLE limit_charges_before_periods;
    END IF;
    CREATE TABLE limit_charges_default PARTITION OF limit_charges DEFAULT;
END
$$;

GRANT SELECT, INSERT, UPDATE, DELETE ON limit_charges TO payauth_worker;

-- What any deletion of charges counted is kept, as migration 030 made it (a statement's
-- trigger on the partitioned table sees the rows of every partition it deleted from).
CREATE TRIGGER limit_charges_kept_when_purged
    AFTER DELETE ON limit_charges REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION payauth_limit_charges_purged();

-- (payauth_dedup_prepare makes the charges' partitions too, given the table: sql/ defines
-- it again with its second argument.)
DROP FUNCTION IF EXISTS payauth_dedup_prepare(integer);
