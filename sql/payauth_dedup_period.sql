-- payauth_dedup_period: the period of the dedup store a time falls in (its UTC day): the
-- partition of processed_transactions a claim made then goes to, and what the purge drops
-- whole (migrations/018_dedup_store_by_period.sql).
CREATE OR REPLACE FUNCTION payauth_dedup_period(p_at timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (p_at AT TIME ZONE 'UTC')::date $$;

GRANT EXECUTE ON FUNCTION payauth_dedup_period TO payauth_worker;
