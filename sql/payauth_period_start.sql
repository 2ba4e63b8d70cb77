-- payauth_period_start: the period of a spending limit a moment falls in, as its first day
-- in the limits' time zone (PAYAUTH_LIMITS_TIMEZONE): DAY the calendar day, WEEK its Monday,
-- MONTH the month's first day; NULL for TRANSACTION (each message alone: nothing is
-- counted). The moment is the message's own time, never when it is decided
-- (payauth_limit_slots); `payauth limits show` asks it of now.
CREATE OR REPLACE FUNCTION payauth_period_start(period text, moment timestamptz, tz text)
RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE period
               WHEN 'DAY' THEN (moment AT TIME ZONE tz)::date
               WHEN 'WEEK' THEN date_trunc('week', moment AT TIME ZONE tz)::date
               WHEN 'MONTH' THEN date_trunc('month', moment AT TIME ZONE tz)::date
           END
$$;

REVOKE ALL ON FUNCTION payauth_period_start FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_period_start TO payauth_worker;
