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
    FOR purged IN SELECT c.relname FROM pg_class c
                   WHERE (c.relname LIKE 'processed\_transactions\_%\_purged'
                          OR c.relname LIKE 'limit\_charges\_%\_purged')
                     AND c.relkind = 'r' AND NOT c.relispartition
                     AND c.relnamespace = 'public'::regnamespace
                   ORDER BY c.relname LOOP
        IF purged LIKE 'limit\_charges\_%' THEN
            EXECUTE format('INSERT INTO purged_limit_charges (limit_id, period_start, amount, '
                           '                                  count) '
                           'SELECT limit_id, period_start, sum(amount), sum(count) FROM %I '
                           ' GROUP BY limit_id, period_start', purged);
        END IF;
        EXECUTE format('DROP TABLE %I', purged);
        RETURN NEXT purged;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_drop_purged FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_dedup_drop_purged TO payauth_worker;
