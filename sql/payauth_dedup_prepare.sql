-- payauth_dedup_prepare: make the dedup store's partitions of the period under way and of
-- the p_ahead periods after it, where missing, before any claim needs them (called by
-- `payauth migrate`, by every worker as it starts and by every purge). A record that went
-- to the default partition for want of its period's partition (the periods were not made
-- in time) is moved into it as it is made. Returns the partitions it made.
--
-- Security definer: the worker's role makes them without owning the table. A partition is
-- made beside the table and attached (SHARE UPDATE EXCLUSIVE on the table: claims go on
-- meanwhile), one maker at a time.
CREATE OR REPLACE FUNCTION payauth_dedup_prepare(p_ahead integer DEFAULT 2)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    today date := payauth_dedup_period(payauth_dedup_clock());
    day   date;
    part  text;
BEGIN
    IF p_ahead IS NULL OR p_ahead < 0 THEN
        RAISE EXCEPTION 'payauth_dedup_prepare: p_ahead must be 0 or more, not %', p_ahead;
    END IF;
    PERFORM pg_advisory_xact_lock(1885436260, -1);  -- one maker at a time ("payd", -1)
    FOR day IN SELECT today + k FROM generate_series(0, p_ahead) AS k LOOP
        part := 'processed_transactions_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(part) IS NOT NULL;
        EXECUTE format('CREATE TABLE %I (LIKE processed_transactions '
                       'INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)', part);
        EXECUTE format('WITH moved AS (DELETE FROM processed_transactions_default '
                       '               WHERE dedup_period = %L RETURNING *) '
                       'INSERT INTO %I SELECT * FROM moved', day, part);
        EXECUTE format('ALTER TABLE processed_transactions ATTACH PARTITION %I '
                       'FOR VALUES FROM (%L) TO (%L)', part, day, day + 1);
        -- (The worker's gauge counts a partition never analyzed on its own.)
        EXECUTE format('GRANT SELECT ON %I TO payauth_worker', part);
        RETURN NEXT part;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_prepare FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_dedup_prepare TO payauth_worker;
