-- The trigger accounts_added_behind_the_fence (migration 027) calls this once before each
-- INSERT into accounts, whoever runs it (`payauth accounts load`, a test, the demo): the
-- insert takes payauth_accounts_fence exclusively, waiting for the batches deciding for an
-- account they found missing, and holds it until it commits. (As the function's owner:
-- any role that may insert into accounts may take the fence, whatever its grants.)
CREATE OR REPLACE FUNCTION payauth_accounts_added_behind_the_fence() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    PERFORM payauth_accounts_fence(true);
    RETURN NULL;
END
$$;
