-- payauth_authorize: decide and write one batch of new authorizations in one statement.
--
-- The worker used to do this in five round trips, holding the accounts' row locks across
-- the middle three: BEGIN; SELECT … FOR UPDATE (read the balances); decide in Python; one
-- write statement; COMMIT. On two busy cores every round trip waits to be scheduled, and
-- a hot account stays locked for all of it. Here the locks are taken, the decisions made
-- and the rows written inside the server, and the call commits on its own (autocommit):
-- one round trip, locks held for the statement only.
--
-- The inputs are the batch in offset order, one array element per authorization. This is
-- the one place the decision rules live; tests/integration/test_authorize_function.py holds
-- it to a Python model of them (tests/support/oracle.py), and tests/unit/test_vocabulary.py
-- its literals to service/domain/vocabulary.py.
-- When fewer transactions are claimed than sent, another replica decided some of them
-- first: the function raises SQLSTATE PA409 and the whole statement is rolled back.
CREATE OR REPLACE FUNCTION payauth_authorize(
    p_txn_ids          text[],
    p_account_ids      text[],
    p_amounts          numeric[],
    p_currencies       text[],
    p_auth_types       text[],
    p_fingerprints     text[],
    p_correlation_ids  text[],
    p_message_ids      text[],
    p_partitions       integer[],
    p_offsets          bigint[],
    p_processed_at     timestamptz,
    p_source_topic     text,
    p_batch_id         uuid
) RETURNS TABLE (result text, decline_reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    n          integer := coalesce(array_length(p_txn_ids, 1), 0);
    ids        text[];     -- the batch's distinct accounts, in lock order
    balances   numeric[];  -- aligned with ids; NULL for an unknown account
    currencies text[];
    statuses   text[];
    slot       integer[];  -- for each authorization, its account's position in ids
    results    text[] := '{}';
    reasons    text[] := '{}';
    deltas     numeric[] := '{}';
    j          integer;
    n_claimed  bigint;
    n_ledger   bigint;
    n_approved bigint;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    -- Lock the accounts in one order (account_id), so that two batches never deadlock.
    PERFORM 1 FROM accounts WHERE account_id = ANY(p_account_ids)
     ORDER BY account_id FOR UPDATE;

    SELECT array_agg(k.id ORDER BY k.id), array_agg(a.balance ORDER BY k.id),
           array_agg(a.currency::text ORDER BY k.id), array_agg(a.status ORDER BY k.id)
      INTO ids, balances, currencies, statuses
      FROM (SELECT DISTINCT unnest(p_account_ids) AS id) k
      LEFT JOIN accounts a ON a.account_id = k.id;

    SELECT array_agg(s.pos ORDER BY t.ord) INTO slot
      FROM unnest(p_account_ids) WITH ORDINALITY AS t(id, ord)
      JOIN unnest(ids) WITH ORDINALITY AS s(id, pos) ON s.id = t.id;

    -- Decide in offset order; each authorization sees the balance the ones before it left.
    FOR i IN 1..n LOOP
        j := slot[i];
        IF balances[j] IS NULL THEN
            results[i] := 'DECLINED'; reasons[i] := 'UNKNOWN_ACCOUNT'; deltas[i] := 0;
        ELSIF statuses[j] <> 'ACTIVE' THEN
            results[i] := 'DECLINED'; reasons[i] := 'ACCOUNT_BLOCKED'; deltas[i] := 0;
        ELSIF currencies[j] <> p_currencies[i] THEN
            results[i] := 'DECLINED'; reasons[i] := 'CURRENCY_MISMATCH'; deltas[i] := 0;
        ELSIF p_auth_types[i] = 'REFUND' THEN
            results[i] := 'APPROVED'; reasons[i] := NULL; deltas[i] := p_amounts[i];
            balances[j] := balances[j] + p_amounts[i];
        ELSIF balances[j] < p_amounts[i] THEN
            results[i] := 'DECLINED'; reasons[i] := 'INSUFFICIENT_FUNDS'; deltas[i] := 0;
        ELSE
            results[i] := 'APPROVED'; reasons[i] := NULL; deltas[i] := -p_amounts[i];
            balances[j] := balances[j] - p_amounts[i];
        END IF;
    END LOOP;

    -- Claim the keys (the unique index serializes replicas: an INSERT of a key another open
    -- transaction inserted waits for it, then conflicts), write the ledger, move balances.
    WITH input AS (
        SELECT *
          FROM unnest(p_txn_ids, p_account_ids, p_amounts, p_currencies, p_auth_types,
                      results, reasons, p_fingerprints, p_correlation_ids, p_message_ids,
                      deltas, p_partitions, p_offsets)
            AS t(txn_id, account_id, amount, currency, auth_type, result, decline_reason,
                 fingerprint, correlation_id, message_id, delta, source_partition,
                 source_offset)
    ), claimed AS (
        INSERT INTO processed_transactions
               (txn_id, processed_at, result, decline_reason, fingerprint, account_id,
                amount, currency, authorization_type, correlation_id, message_id,
                source_topic, source_partition, source_offset, batch_id)
        SELECT i.txn_id, p_processed_at, i.result, i.decline_reason, i.fingerprint,
               i.account_id, i.amount, i.currency, i.auth_type, i.correlation_id,
               i.message_id, p_source_topic, i.source_partition, i.source_offset, p_batch_id
          FROM input i
            ON CONFLICT (txn_id) DO NOTHING
        RETURNING 1
    ), ledger AS (
        INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at)
        SELECT i.txn_id, i.account_id, i.delta, i.currency, i.auth_type, p_processed_at
          FROM input i
         WHERE i.result = 'APPROVED'
            ON CONFLICT (txn_id) DO NOTHING
        RETURNING 1
    ), moved AS (
        UPDATE accounts a
           SET balance = a.balance + d.delta, updated_at = p_processed_at
          FROM (SELECT i.account_id, sum(i.delta) AS delta
                  FROM input i WHERE i.result = 'APPROVED' GROUP BY i.account_id) d
         WHERE a.account_id = d.account_id
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM claimed), (SELECT count(*) FROM ledger)
      INTO n_claimed, n_ledger;

    SELECT count(*) INTO n_approved FROM unnest(results) AS r WHERE r = 'APPROVED';
    IF n_claimed <> n OR n_ledger <> n_approved THEN
        RAISE EXCEPTION 'claimed % of % (ledger % of %): another replica decided first',
                        n_claimed, n, n_ledger, n_approved
              USING ERRCODE = 'PA409';
    END IF;

    RETURN QUERY SELECT u.r, u.w FROM unnest(results, reasons) WITH ORDINALITY AS u(r, w, k)
                  ORDER BY u.k;
END
$$;

REVOKE ALL ON FUNCTION payauth_authorize FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_authorize TO payauth_worker;
