-- payauth_dedup_set_period: the length of the dedup store's periods, in seconds (a day
-- unless set; at least a minute, at most a week), for a store that holds no record yet: its
-- partitions are made again for the new length. A store that holds records keeps its
-- length (their partitions would overlap the new ones): refused.
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
    LOCK TABLE processed_transactions IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM processed_transactions) THEN
        RAISE EXCEPTION 'payauth_dedup_set_period: the dedup store holds records; its '
                        'periods keep their length';
    END IF;
    UPDATE dedup_store SET period_seconds = p_seconds;  -- (its CHECK bounds the length)
    FOR part IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'processed_transactions'::regclass
                   AND c.relname <> 'processed_transactions_default' LOOP
        EXECUTE format('DROP TABLE %I', part);
    END LOOP;
    RETURN QUERY SELECT * FROM payauth_dedup_prepare();
END
$$;

REVOKE ALL ON FUNCTION payauth_dedup_set_period FROM PUBLIC;
