-- payauth_dedup_drop_purged: drop the partitions the purge detached, also those a purge
-- stopped before dropping; returns their names. The dedup store's (tables
-- processed_transactions_*_purged, payauth_dedup_drop_period) are dropped; the spending
-- limits' charges' (limit_charges_*_purged, payauth_limit_charges_drop_periods) are first
-- summed per limit and period into purged_limit_charges, in the same transaction, so that a
-- usage stays what its charges count plus what was purged of them (until then `payauth
-- verify` counts them where they are: payauth_limit_charges_detached). No lock on the store
-- or the charges: a claim never waits for the sum, nor for the file system to free them.
-- Security definer: the worker's role purges without owning the tables.
CREATE OR REPLACE FUNCTION payauth_dedup_drop_purged() RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    purged text;
BEGIN
    -- What the charges' tables count, summed as payauth_limit_charges_detached reads them,
    -- before any is dropped; no charges' partition detached between the two statements
    -- (its detach waits for this lock, which no batch waits for).
    LOCK TABLE limit_charges IN ACCESS SHARE MODE;
    INSERT INTO purged_limit_charges (limit_id, period_start, amount, count)
    SELECT d.limit_id, d.period_start, d.amount, d.count
      FROM payauth_limit_charges_detached() d;
    FOR purged IN SELECT c.relname FROM pg_class c
                   WHERE (c.relname LIKE 'processed\_transactions\_%\_purged'
                          OR c.relname LIKE 'limit\_charges\_%\_purged')
                     AND c.relkind = 'r' AND NOT c.relispartition
                     AND c.relnamespace = 'public'::regnamespace
                   ORDER BY c.relname LOOP
        EXECUTE format('DROP TABLE %I', purged);
        RETURN NEXT purged;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_drop_purged FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_dedup_drop_purged TO payauth_worker;
