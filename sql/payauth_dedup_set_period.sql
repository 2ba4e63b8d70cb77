-- payauth_dedup_set_period: the length of the dedup store's periods, in seconds (a day
-- unless set; at least a minute, at most a week), for a store that holds no record yet: its
-- partitions, and the spending limits' charges' (by the same periods), are made again for
-- the new length. A store that holds records keeps its length (their partitions would
-- overlap the new ones): refused, as where a charge is kept. Claims under way finish first
-- (it waits for the fence of their period, then for the tables); the next ones read the
-- new length.
--
-- For a store whose retention window is far from a day: the chaos run's and the soak's
-- windows of minutes purge whole periods only if a period is shorter than the window. Not
-- granted to the worker's role.
CREATE OR REPLACE FUNCTION payauth_dedup_set_period(p_seconds integer) RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    part text;
BEGIN
    -- (The claims of the period under way first, as the fence orders them: one that read
    -- the old length goes on before this, or reads the new one and is retried.)
    PERFORM pg_advisory_xact_lock((1885436260::bigint << 32)
        + extract(epoch FROM payauth_dedup_period(payauth_dedup_clock()))::bigint);
    LOCK TABLE processed_transactions IN ACCESS EXCLUSIVE MODE;
    LOCK TABLE limit_charges IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM processed_transactions) THEN
        RAISE EXCEPTION 'payauth_dedup_set_period: the dedup store holds records; its '
                        'periods keep their length';
    END IF;
    IF EXISTS (SELECT 1 FROM limit_charges) THEN  -- (a standing hold's, kept past its record)
        RAISE EXCEPTION 'payauth_dedup_set_period: the spending limits keep charges counted '
                        'in the store''s periods; its periods keep their length';
    END IF;
    UPDATE dedup_store SET period_seconds = p_seconds;  -- (its CHECK bounds the length)
    -- (An insert naming only the contract's columns takes the period under way: migration
    -- 023.)
    EXECUTE format('ALTER TABLE processed_transactions ALTER COLUMN dedup_period SET DEFAULT '
                   'to_timestamp(floor(extract(epoch FROM clock_timestamp()) / %s) * %s)',
                   p_seconds, p_seconds);
    FOR part IN SELECT b.name FROM payauth_partitions('processed_transactions') b
                 WHERE b.upper IS NOT NULL
                 UNION ALL
                SELECT b.name FROM payauth_partitions('limit_charges') b
                 WHERE b.upper IS NOT NULL LOOP
        EXECUTE format('DROP TABLE %I', part);
    END LOOP;
    RETURN QUERY SELECT * FROM payauth_dedup_prepare();
    RETURN QUERY SELECT * FROM payauth_dedup_prepare(p_table => 'limit_charges');
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_set_period FROM PUBLIC;
