-- payauth_limit_usage_purged: what the purge took away of the spending limits' charges,
-- kept with each limit's usage in its period (limit_usage.purged_amount, purged_count), so
-- that a usage stays what its charges count plus what was purged of them (`payauth verify`
-- holds every period to it, exactly). The arrays are the charges deleted, one element
-- each; called by the purge in the transaction that deletes them
-- (payauth_dedup_drop_period, and service/adapters/retention.py for the records no period
-- takes whole). The usage rows are locked in their key's order, as a batch's upsert takes
-- them (payauth_limits_charge). A charge with no usage row (none is written without one)
-- leaves nothing.
CREATE OR REPLACE FUNCTION payauth_limit_usage_purged(
    p_limit_ids     text[],
    p_period_starts date[],
    p_amounts       numeric[],
    p_counts        integer[]
) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM limit_usage u
      JOIN unnest(p_limit_ids, p_period_starts) AS g(lim, start)
        ON u.limit_id = g.lim AND u.period_start = g.start
     ORDER BY u.limit_id, u.period_start
       FOR UPDATE OF u;
    UPDATE limit_usage u
       SET purged_amount = u.purged_amount + g.amount, purged_count = u.purged_count + g.count
      FROM (SELECT g.lim, g.start, sum(g.amount) AS amount, sum(g.count)::integer AS count
              FROM unnest(p_limit_ids, p_period_starts, p_amounts, p_counts)
                   AS g(lim, start, amount, count)
             GROUP BY g.lim, g.start) g
     WHERE u.limit_id = g.lim AND u.period_start = g.start;
END
$$;

REVOKE ALL ON FUNCTION payauth_limit_usage_purged FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limit_usage_purged TO payauth_worker;
