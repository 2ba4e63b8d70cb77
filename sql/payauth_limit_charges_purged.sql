-- payauth_limit_charges_purged: the trigger limit_charges_kept_when_purged (migration 030)
-- calls this once after each statement that deletes spending limits' charges (the purge:
-- payauth_limit_charges_drop_periods with the default partition's of a period gone,
-- service/adapters/retention.py with the records no period takes whole; a period's own
-- partition is summed as it is dropped, payauth_dedup_drop_purged): what they counted is kept, summed per limit and period, in
-- purged_limit_charges, so that a usage stays what its charges count plus what was purged
-- of them (`payauth verify` holds every period to it, exactly); a charge deleted by hand is
-- kept so too, as taken away from the charges, not from the usage. Only rows are added: no
-- usage row is locked, which every batch counting in that limit writes. (As the function's
-- owner: the worker's role purges without writing that table itself.)
CREATE OR REPLACE FUNCTION payauth_limit_charges_purged() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    INSERT INTO purged_limit_charges (limit_id, period_start, amount, count)
    SELECT g.limit_id, g.period_start, sum(g.amount), sum(g.count)
      FROM gone g
     GROUP BY g.limit_id, g.period_start;
    RETURN NULL;
END
$$;
