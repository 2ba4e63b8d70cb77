-- A limit's usage keeps what the purge took away of its charges (purged_amount,
-- purged_count), so that `payauth verify` holds every period's usage to its charges plus
-- what was purged of them, exactly: before, a period older than the oldest record kept (a
-- month's, from its fourth day on) could only be held to at least its charges, and a
-- usage counted twice there went unseen. The purge adds what it deletes
-- (sql/payauth_limit_usage_purged.sql, made again from sql/ in the same run).
ALTER TABLE limit_usage ADD COLUMN purged_amount numeric NOT NULL DEFAULT 0,
                        ADD COLUMN purged_count integer NOT NULL DEFAULT 0;

-- The periods verify could not hold exactly until now (the day before them older than the
-- oldest record kept, or no record kept at all): what their usage counts beyond the
-- charges left is what was purged. A usage below its charges there is not made good: verify
-- names it, as before.
UPDATE limit_usage u
   SET purged_amount = greatest(u.amount - coalesce(c.amount, 0), 0),
       purged_count = greatest(u.count - coalesce(c.count, 0), 0)
  FROM limit_usage l
  LEFT JOIN (SELECT limit_id, period_start, sum(amount) AS amount, sum(count) AS count
               FROM limit_charges GROUP BY limit_id, period_start) c
         USING (limit_id, period_start)
 WHERE l.limit_id = u.limit_id AND l.period_start = u.period_start
   AND NOT coalesce(u.period_start - 1 >= (SELECT min(processed_at)::date
                                             FROM processed_transactions), false);
