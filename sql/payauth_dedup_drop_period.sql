-- payauth_dedup_drop_period: detach the oldest partition of the dedup store whose whole
-- period is past the retention window (p_retention_hours) and that keeps no record within
-- it (an administrator may have set one's processed_at later). One period a call, each in
-- its own transaction (`payauth purge` calls it until it answers nothing); returns the
-- partition detached and how many records went with it (PostgreSQL's estimate for a
-- partition analyzed), or no row. The detached partition is renamed NAME_purged, out of the
-- store, and payauth_dedup_drop_purged drops it in a transaction of its own. The spending
-- limits' charges counted in the periods gone are detached after them, in a transaction of
-- their own (payauth_limit_charges_drop_periods): a claim never waits for both tables.
--
-- Never the period under way, the ones ahead or the default partition. Detaching a
-- partition takes ACCESS EXCLUSIVE on the table, on that partition and on the default
-- partition for a moment (the claims under way finish first, the next ones wait), never on
-- the other periods' partitions; no longer than lock_timeout (1 s for the table, 3 s for
-- the two partitions, locked first in a mode that makes no claim wait), or it is left to
-- the next purge. Only detached: dropping frees the files, which takes the file system a
-- time that grows with them (tens of ms a million records), and no claim waits for that.
-- Security definer: the worker's role purges without owning the table.
CREATE OR REPLACE FUNCTION payauth_dedup_drop_period(p_retention_hours float8)
RETURNS TABLE (part text, records bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    cutoff timestamptz := payauth_dedup_clock() - p_retention_hours * interval '1 hour';
    victim text;
    kept   boolean;
    n      bigint;
BEGIN
    IF p_retention_hours IS NULL OR p_retention_hours <= 0 THEN
        RAISE EXCEPTION 'payauth_dedup_drop_period: the window must be above 0 hours, not %',
                        p_retention_hours;
    END IF;
    FOR victim IN
        SELECT b.name
          FROM payauth_partitions('processed_transactions') b
         WHERE b.upper IS NOT NULL  -- (the default partition has no bound)
           AND b.upper <= cutoff
         ORDER BY b.upper
    LOOP
        -- First the partitions the detach locks besides the store, the period and the
        -- default partition, in the mode a vacuum holds (claims take no lock it conflicts
        -- with), before anything else is locked: waiting for a vacuum of either (an
        -- autovacuum is cancelled by PostgreSQL after deadlock_timeout, 1 s by default; a
        -- manual or anti-wraparound one is not, and the period is left to the next purge)
        -- makes no claim wait for the store.
        PERFORM set_config('lock_timeout', '3s', true);
        EXECUTE format('LOCK TABLE %I IN SHARE UPDATE EXCLUSIVE MODE', victim);
        LOCK TABLE processed_transactions_default IN SHARE UPDATE EXCLUSIVE MODE;
        PERFORM set_config('lock_timeout', '1s', true);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE processed_at >= $1)', victim)
           INTO kept USING cutoff;
        CONTINUE WHEN kept;
        -- (PostgreSQL's estimate once the partition was analyzed, as autovacuum does long
        -- before a period is past the window: a count would read every record.)
        n := (SELECT c.reltuples::bigint FROM pg_class c
               WHERE c.oid = victim::regclass AND c.reltuples >= 0);
        IF n IS NULL THEN
            EXECUTE format('SELECT count(*) FROM %I', victim) INTO n;
        END IF;
        -- Then the store ONLY: the other periods' partitions are not locked (today's,
        -- which autovacuum works through most often, is vacuumed while claims go on).
        LOCK TABLE ONLY processed_transactions IN ACCESS EXCLUSIVE MODE;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE processed_at >= $1)', victim)
           INTO kept USING cutoff;
        IF kept THEN  -- (set within the window meanwhile)
            RAISE EXCEPTION 'payauth_dedup_drop_period: % gained a record within the window',
                            victim USING ERRCODE = '40001';
        END IF;
        EXECUTE format('ALTER TABLE processed_transactions DETACH PARTITION %I', victim);
        EXECUTE format('ALTER TABLE %I RENAME TO %I', victim, victim || '_purged');
        part := victim; records := n;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_drop_period FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_dedup_drop_period TO payauth_worker;
