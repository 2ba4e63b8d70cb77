-- payauth_authorize_purchases: payauth_authorize's route for a batch of purchases and
-- refunds that no orphan reversal waits for (sql/payauth_authorize.sql chooses it, with the
-- accounts locked). Set-based: read the accounts once, decide each message in offset order
-- against the available balance (balance - held) the ones before it left, with
-- payauth_decide, in memory; then one statement claims the keys, writes the ledger and
-- moves the balances. The claim is the unique index on processed_transactions.txn_id: an
-- INSERT of a key that another open transaction inserted waits for it, then conflicts;
-- fewer claimed than sent raises SQLSTATE PA409 and the whole statement is rolled back.
CREATE OR REPLACE FUNCTION payauth_authorize_purchases(
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
    rule       text;       -- payauth_decide's version
    decision   text;
    seen_bal   numeric[] := '{}';  -- what each authorization's decision read
    seen_stat  text[] := '{}';
    seen_cur   text[] := '{}';
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

    SELECT array_agg(k.id ORDER BY k.id), array_agg(a.balance - a.held ORDER BY k.id),
           array_agg(a.currency::text ORDER BY k.id), array_agg(a.status ORDER BY k.id)
      INTO ids, balances, currencies, statuses
      FROM (SELECT DISTINCT unnest(p_account_ids) AS id) k
      LEFT JOIN accounts a ON a.account_id = k.id;

    SELECT array_agg(s.pos ORDER BY t.ord) INTO slot
      FROM unnest(p_account_ids) WITH ORDINALITY AS t(id, ord)
      JOIN unnest(ids) WITH ORDINALITY AS s(id, pos) ON s.id = t.id;

    rule := payauth_rule_version();

    -- Decide in offset order; each authorization sees the available balance the ones
    -- before it left (the ledger balance less what active holds keep).
    FOR i IN 1..n LOOP
        j := slot[i];
        seen_bal[i] := balances[j]; seen_stat[i] := statuses[j]; seen_cur[i] := currencies[j];
        decision := payauth_decide(balances[j], statuses[j], currencies[j], p_currencies[i],
                                   p_auth_types[i], p_amounts[i]);
        IF decision IS NULL THEN  -- a broken rule stops the partition, it never approves
            RAISE EXCEPTION 'payauth_decide returned NULL for transaction %', p_txn_ids[i];
        ELSIF decision <> 'APPROVED' THEN
            results[i] := 'DECLINED'; reasons[i] := decision; deltas[i] := 0;
        ELSIF p_auth_types[i] = 'REFUND' THEN
            results[i] := 'APPROVED'; reasons[i] := NULL; deltas[i] := p_amounts[i];
            balances[j] := balances[j] + p_amounts[i];
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
                      deltas, p_partitions, p_offsets, seen_bal, seen_stat, seen_cur)
            AS t(txn_id, account_id, amount, currency, auth_type, result, decline_reason,
                 fingerprint, correlation_id, message_id, delta, source_partition,
                 source_offset, input_balance, input_status, input_currency)
    ), claimed AS (
        INSERT INTO processed_transactions
               (txn_id, processed_at, result, decline_reason, fingerprint, account_id,
                amount, currency, authorization_type, correlation_id, message_id,
                source_topic, source_partition, source_offset, batch_id, input_balance,
                input_status, input_currency, rule_version)
        SELECT i.txn_id, p_processed_at, i.result, i.decline_reason, i.fingerprint,
               i.account_id, i.amount, i.currency, i.auth_type, i.correlation_id,
               i.message_id, p_source_topic, i.source_partition, i.source_offset, p_batch_id,
               i.input_balance, i.input_status, i.input_currency, rule
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

REVOKE ALL ON FUNCTION payauth_authorize_purchases FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_authorize_purchases TO payauth_worker;
