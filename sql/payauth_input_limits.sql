-- payauth_input_limits: what a decision read of its limits, as its dedup record keeps it,
-- as one jsonb array of objects {limit_id, period_start, max_amount, max_count,
-- used_amount, used_count}: input_limit_reads (payauth_limits_read), or for a record
-- decided before migration 025, the document input_limits held. NULL: no limit counted the
-- message. Read by `payauth explain`, `payauth replay --shadow` and `payauth verify`.
CREATE OR REPLACE FUNCTION payauth_input_limits(reads limit_read[], document jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(to_jsonb(reads), document)
$$;

REVOKE ALL ON FUNCTION payauth_input_limits FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_input_limits TO payauth_worker;
