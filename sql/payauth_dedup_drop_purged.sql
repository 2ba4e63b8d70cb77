-- payauth_dedup_drop_purged: drop the partitions payauth_dedup_drop_period detached from the
-- dedup store (tables processed_transactions_*_purged, no longer partitions of it), also
-- those a purge stopped before dropping; returns their names. No lock on the store: a
-- claim never waits for the file system to free them. Security definer: the worker's role
-- purges without owning the tables.
CREATE OR REPLACE FUNCTION payauth_dedup_drop_purged() RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    purged text;
BEGIN
    FOR purged IN SELECT c.relname FROM pg_class c
                   WHERE c.relname LIKE 'processed\_transactions\_%\_purged'
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
