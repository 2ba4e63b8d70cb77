-- An account added while a batch decides for it as unknown waits until that batch commits,
-- and a batch that names an account not there waits for an insert of accounts under way,
-- then is retried (sql/payauth_accounts_fence.sql says why). Every INSERT into accounts takes the fence
-- first, whoever runs it: a trigger for each statement. The functions are made here as
-- the trigger needs them; sql/ keeps their current definitions, applied in the same run.
CREATE OR REPLACE FUNCTION payauth_accounts_fence(p_adding boolean) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_adding THEN
        PERFORM pg_advisory_xact_lock(1885436257::bigint << 32);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(1885436257::bigint << 32);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION payauth_accounts_added_behind_the_fence() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    PERFORM payauth_accounts_fence(true);
    RETURN NULL;
END
$$;

CREATE TRIGGER accounts_added_behind_the_fence
    BEFORE INSERT ON accounts
    FOR EACH STATEMENT EXECUTE FUNCTION payauth_accounts_added_behind_the_fence();
