-- payauth_dedup_prepare: make the partitions of the period under way and of the periods
-- after it, where missing, before any claim needs them, of the dedup store or (p_table) of
-- the spending limits' charges, partitioned by the same periods: p_ahead periods, and at
-- least ten minutes' (a lookup reads every partition, those ahead too: short periods make
-- few more of them than they need) (called for each, in transactions of their own, the
-- store first, by `payauth migrate`, by every worker as it starts and then every quarter
-- of a period, at most hourly, and by every purge: one table's default partition locked
-- never waits for the other's). A record that went to the default partition for want of
-- its period's partition (none was made in time) is moved into it as it is made, and a
-- charge likewise. Returns the partitions it made.
--
-- Security definer: the worker's role makes them without owning the tables. A partition is
-- made beside the table and attached (SHARE UPDATE EXCLUSIVE on the table: claims go on
-- meanwhile), one maker at a time. A period's partition made once its claims may already go
-- to the default partition (the period under way, or one with rows there) is made under
-- ACCESS EXCLUSIVE on the table (never on the other periods' partitions) instead: no claim
-- writes to the default partition while its rows move (one written meanwhile would fail
-- the attach), and no lookup reads the table half moved. The attach locks the default
-- partition too, so it is locked first, in the mode a vacuum holds (no claim waits for
-- it). Each lock is waited for no longer than lock_timeout (1 s; 3 s for the default
-- partition's first lock): the attempt then fails whole (SQLSTATE 55P03), and the next one
-- makes them.
CREATE OR REPLACE FUNCTION payauth_dedup_prepare(
    p_ahead integer DEFAULT 2,
    p_table regclass DEFAULT 'processed_transactions'  -- or limit_charges
) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp SET lock_timeout = '1s'
AS $$
DECLARE
    length interval := (SELECT make_interval(secs => period_seconds) FROM dedup_store);
    start  timestamptz := payauth_dedup_period(payauth_dedup_clock());
    tbl    constant text := p_table::text;
    ahead  integer;
    lo     timestamptz;
    hi     timestamptz;
    part   text;
    kept   boolean;
BEGIN
    IF p_ahead IS NULL OR p_ahead < 0 THEN
        RAISE EXCEPTION 'payauth_dedup_prepare: p_ahead must be 0 or more, not %', p_ahead;
    END IF;
    IF tbl IS NULL OR tbl NOT IN ('processed_transactions', 'limit_charges') THEN
        RAISE EXCEPTION 'payauth_dedup_prepare: partitions of processed_transactions or '
                        'limit_charges, not of %', tbl;
    END IF;
    ahead := greatest(p_ahead, ceil(600 / extract(epoch FROM length))::integer);
    PERFORM pg_advisory_xact_lock(1885436260::bigint << 32);  -- one maker at a time
    FOR k IN 0..ahead LOOP
        lo := start + k * length;
        hi := start + (k + 1) * length;
        part := tbl || '_' || to_char(lo AT TIME ZONE 'UTC', 'yyyymmdd"_"hh24miss');
        -- (Nor where a partition covers part of the period: the charges' of before their
        -- periods, migration 032, covers the period its upgrade ran in.)
        CONTINUE WHEN EXISTS (SELECT 1 FROM payauth_partitions(p_table) b
                               WHERE b.upper > lo AND (b.lower IS NULL OR b.lower < hi));
        -- (Before the table, as a purge's detach does: the same order, no deadlock; an
        -- autovacuum of it is cancelled by PostgreSQL after deadlock_timeout.)
        PERFORM set_config('lock_timeout', '3s', true);
        EXECUTE format('LOCK TABLE %I IN SHARE UPDATE EXCLUSIVE MODE', tbl || '_default');
        PERFORM set_config('lock_timeout', '1s', true);
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
                       'INCLUDING STORAGE)', part, tbl);
        IF k = 0 THEN
            kept := true;
        ELSE
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I '
                           '               WHERE dedup_period >= $1 AND dedup_period < $2)',
                           tbl || '_default') INTO kept USING lo, hi;
        END IF;
        IF kept THEN
            -- (ONLY: the other periods' partitions are not locked; a vacuum of today's,
            -- which autovacuum works through most often, goes on meanwhile.)
            EXECUTE format('LOCK TABLE ONLY %I IN ACCESS EXCLUSIVE MODE', tbl);
        END IF;
        EXECUTE format('WITH moved AS (DELETE FROM %I '
                       '               WHERE dedup_period >= %L AND dedup_period < %L '
                       '               RETURNING *) '
                       'INSERT INTO %I SELECT * FROM moved',
                       tbl || '_default', lo, hi, part);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       tbl, part, lo, hi);
        IF tbl = 'processed_transactions' THEN
            -- (The worker's gauge counts a partition never analyzed on its own.)
            EXECUTE format('GRANT SELECT ON %I TO payauth_worker', part);
        END IF;
        RETURN NEXT part;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_prepare FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_dedup_prepare TO payauth_worker;
