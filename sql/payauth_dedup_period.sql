-- payauth_dedup_period: the start of the dedup store's period a time falls in (periods of
-- dedup_store.period_seconds, counted from the Unix epoch: a day is a UTC day): the
-- dedup_period a claim made then writes, the partition of processed_transactions it goes
-- to, and what the purge drops whole (migrations/018_dedup_store_by_period.sql).
CREATE OR REPLACE FUNCTION payauth_dedup_period(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT to_timestamp(floor(extract(epoch FROM p_at) / s.period_seconds) * s.period_seconds)
  FROM dedup_store s
$$;

GRANT EXECUTE ON FUNCTION payauth_dedup_period TO payauth_worker;
