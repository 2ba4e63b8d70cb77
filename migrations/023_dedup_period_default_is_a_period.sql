-- An insert into the dedup store that names only the contract's columns (an administrator's,
-- a tool's) gets the start of the period under way as its dedup_period, as a claim writes
-- it, not the time it is made: two such records of one transaction_id in one period meet
-- on the primary key (txn_id, dedup_period), as two claims do. (A time within the period
-- made one record per transaction start.) The expression holds the store's period length;
-- payauth_dedup_set_period writes it again for a new one. (A default, not a function of
-- sql/: the migrations run before the definitions exist on a new database.)
DO $$
DECLARE
    seconds integer := (SELECT period_seconds FROM dedup_store);
BEGIN
    EXECUTE format('ALTER TABLE processed_transactions ALTER COLUMN dedup_period SET DEFAULT '
                   'to_timestamp(floor(extract(epoch FROM clock_timestamp()) / %s) * %s)',
                   seconds, seconds);
END
$$;
