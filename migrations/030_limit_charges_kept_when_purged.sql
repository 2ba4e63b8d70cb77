-- What the purge takes away of the spending limits' charges is kept, summed per limit and
-- period (purged_limit_charges), so that `payauth verify` holds every period's usage to its
-- charges plus what was purged of them, exactly: before, a period older than the oldest
-- record kept (a month's, from its fourth day on) could only be held to at least its
-- charges, and a usage counted twice there went unseen. A table of its own, written by a
-- trigger on the charges' deletion (sql/payauth_limit_charges_purged.sql): the purge never
-- locks a usage row, which every batch counting in that limit writes. The function is made
-- here, as the trigger needs one, keeping nothing; sql/ keeps its current definition,
-- applied in the same run.
CREATE TABLE purged_limit_charges (
    limit_id     text NOT NULL,
    period_start date NOT NULL,
    amount       numeric NOT NULL,
    count        bigint NOT NULL,
    purged_at    timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION payauth_limit_charges_purged() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    RETURN NULL;
END
$$;

CREATE TRIGGER limit_charges_kept_when_purged
    AFTER DELETE ON limit_charges REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION payauth_limit_charges_purged();

-- The periods verify could not hold exactly until now (the day before them older than the
-- oldest record kept, or no record kept at all): what their usage counts beyond the
-- charges left is what was purged. A usage below its charges there is not made good: verify
-- names it, as before.
INSERT INTO purged_limit_charges (limit_id, period_start, amount, count)
SELECT u.limit_id, u.period_start, greatest(u.amount - coalesce(c.amount, 0), 0),
       greatest(u.count - coalesce(c.count, 0), 0)
  FROM limit_usage u
  LEFT JOIN (SELECT limit_id, period_start, sum(amount) AS amount, sum(count) AS count
               FROM limit_charges GROUP BY limit_id, period_start) c
         USING (limit_id, period_start)
 WHERE NOT coalesce(u.period_start - 1 >= (SELECT min(processed_at)::date
                                             FROM processed_transactions), false)
   AND (u.amount > coalesce(c.amount, 0) OR u.count > coalesce(c.count, 0));
