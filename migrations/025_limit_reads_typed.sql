-- What a decision read of its limits is kept with its dedup record as an array of a
-- composite type (input_limit_reads) instead of a jsonb document (input_limits): building a
-- document per message turned each value into text and jsonb_agg took each document apart
-- again, the largest part of what a card's limits cost a purchase (docs/benchmark.md).
-- Records decided before keep input_limits; payauth_input_limits reads either as the
-- document it always was (`payauth explain`, `replay --shadow`, `verify`).
-- (Adding a column without a default rewrites nothing.)
CREATE TYPE limit_read AS (
    limit_id     text,
    period_start date,      -- NULL: a TRANSACTION limit
    max_amount   numeric,
    max_count    integer,
    used_amount  numeric,   -- the usage in that period the decision read
    used_count   integer
);
ALTER TABLE processed_transactions ADD COLUMN input_limit_reads limit_read[];

-- Its result is now the composite array (sql/payauth_limits_read.sql makes it again).
DROP FUNCTION IF EXISTS payauth_limits_read(integer[], text[], date[], numeric[], integer[],
                                            numeric[], integer[]);
