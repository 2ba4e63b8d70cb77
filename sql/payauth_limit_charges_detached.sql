-- payauth_limit_charges_detached: what the spending limits' charges detached by the purge
-- and not yet summed into purged_limit_charges count (tables limit_charges_*_purged,
-- payauth_limit_charges_drop_periods; payauth_dedup_drop_purged sums and drops them), per
-- limit and period, as the caller's snapshot sees them: `payauth verify` holds each usage
-- to its charges, these and what was purged. A table dropped since the caller's snapshot
-- was taken is an error (undefined_table): the caller takes a new snapshot. Security
-- definer: the tables are out of the worker's reach.
CREATE OR REPLACE FUNCTION payauth_limit_charges_detached()
RETURNS TABLE (limit_id text, period_start date, amount numeric, count bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    detached text;
BEGIN
    FOR detached IN SELECT c.relname FROM pg_class c
                     WHERE c.relname LIKE 'limit\_charges\_%\_purged'
                       AND c.relkind = 'r' AND NOT c.relispartition
                       AND c.relnamespace = 'public'::regnamespace LOOP
        RETURN QUERY EXECUTE format('SELECT limit_id, period_start, sum(amount), '
                                    '       sum(count)::bigint FROM %I '
                                    ' GROUP BY limit_id, period_start', detached);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_limit_charges_detached FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limit_charges_detached TO payauth_worker;
