-- payauth_dedup_clock: the one clock the dedup store's periods are read from (the claim's
-- fence, the partitions made ahead, the purge), the server's: every claim compares its
-- period against the same clock. (One place, so that the tests of a period's end set it in
-- their own database.)
CREATE OR REPLACE FUNCTION payauth_dedup_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT clock_timestamp() $$;

GRANT EXECUTE ON FUNCTION payauth_dedup_clock TO payauth_worker;
