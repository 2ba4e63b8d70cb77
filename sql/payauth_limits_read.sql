-- payauth_limits_read: what each decision read of its limits, for its dedup record
-- (processed_transactions.input_limit_reads, read through payauth_input_limits: `payauth
-- explain` shows it, `payauth replay --shadow` judges from it): one row per message that a
-- limit counts, its limits in their id's order, each with its period, maximums and the
-- usage the decision read. The arrays are a set-based route's pairs (payauth_batch_controls)
-- and the usage each pair's decision read.
CREATE OR REPLACE FUNCTION payauth_limits_read(
    p_msg        integer[],
    p_limit      text[],
    p_start      date[],
    p_max_amount numeric[],
    p_max_count  integer[],
    p_seen_amount numeric[],
    p_seen_count  integer[]
) RETURNS TABLE (ord bigint, lims limit_read[])
LANGUAGE sql IMMUTABLE
AS $$
    SELECT q.i, array_agg(ROW(q.lim, q.start, q.ma, q.mc, q.ua, q.uc)::limit_read ORDER BY q.k)
      FROM unnest(p_msg, p_limit, p_start, p_max_amount, p_max_count, p_seen_amount,
                  p_seen_count) WITH ORDINALITY AS q(i, lim, start, ma, mc, ua, uc, k)
     GROUP BY q.i
$$;

REVOKE ALL ON FUNCTION payauth_limits_read FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limits_read TO payauth_worker;
