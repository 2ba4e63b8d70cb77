-- payauth_accounts_fence: what keeps an account a batch found missing missing until the
-- batch commits. payauth_authorize locks its batch's accounts first, and from then on
-- reads them in later statements, each in a snapshot of its own: an account added and
-- committed in between would be found by those reads without being locked (decided on,
-- written for, by two batches at once). So every INSERT into accounts takes this fence
-- exclusively first (the trigger accounts_added_behind_the_fence, migration 027), and a
-- batch that names an account not there takes it shared, then counts what it names again:
--
-- * an insert under way (uncommitted) is waited for; an account it added, or one another
--   insert committed since the batch locked, would be locked out of account_id order (a
--   deadlock with a batch that locked it in order): the batch is refused, SQLSTATE 40001,
--   and the worker's retry locks it in order;
-- * an insert that comes later waits until the batch has committed, having treated the
--   account as unknown all through (an orphan reversal it kept is then seen by the batch
--   that decides its original on the new account).
--
-- One lock for every account: inserts are an operator's loads, rare and short; a batch
-- takes it only when an account it names is not there. A transaction lock ("paya" in the
-- high half), never held across a commit.
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

REVOKE ALL ON FUNCTION payauth_accounts_fence FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_accounts_fence TO payauth_worker;
