-- payauth_authorize answers a key another transaction decided while the batch waited for it
-- (a row whose claim_lost names it) and decides the rest, instead of refusing the whole
-- batch: its result gains that column, and a function's result type cannot be changed in
-- place. sql/payauth_authorize.sql makes it again, in the same run of `payauth migrate`.
DROP FUNCTION IF EXISTS payauth_authorize(text[], text[], numeric[], text[], text[], text[],
                                          text[], text[], integer[], bigint[], timestamptz,
                                          text, uuid, text[], numeric[], text[], boolean[],
                                          boolean[], text[], text[], text[], text[], text);
