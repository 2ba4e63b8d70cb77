-- payauth_authorize_purchases: payauth_authorize's route for a batch of PURCHASE, REFUND,
-- VERIFICATION and BALANCE_INQUIRY that no orphan reversal nor early clearing waits for
-- (sql/payauth_authorize.sql chooses it, with the accounts locked). Set-based: read the accounts once, decide each
-- message in offset order against the available balance (balance - held) the ones before
-- it left, with payauth_decide, in memory; then one statement claims the keys, writes the
-- ledger and moves the balances. The claim is the primary key of processed_transactions
-- (txn_id, the period): an INSERT of a key that another open transaction inserted waits for
-- it, then violates the key; payauth_authorize undoes the route, answers the keys decided
-- meanwhile lost and decides the rest.
--
-- What moves is the amount in the account's currency (payauth_account_amount: the amount,
-- or the network's billing amount), as much of it as payauth_approved approves (a partial
-- approval: the available balance). A VERIFICATION moves nothing; a BALANCE_INQUIRY moves
-- nothing and keeps the balances it read, which its event gives (and every republication
-- of it, whatever the balance is by then). The ledger entry is in the account's currency;
-- its request's fingerprint is kept beside it when the entry alone does not say what was
-- asked (a partial approval, a conversion).
--
-- The card's controls (payauth_batch_controls, read once): each message is judged by its
-- card's verdict and the room its limits leave, the usage carried on in memory through the
-- batch; the approved ones are counted (payauth_limits_charge) after the claims, and what
-- each decision read of them is kept with its dedup record.
--
-- One row per message: result, decline reason, what was approved when that is not the
-- amount as sent (a partial approval, a conversion; NULL otherwise), true for a partial
-- approval (NULL otherwise), an inquiry's ledger and available balances, the account's
-- currency (NULL: no such account), the card's status for a CARD_BLOCKED and the limit a
-- LIMIT_EXCEEDED names.
CREATE OR REPLACE FUNCTION payauth_authorize_purchases(
    p_txn_ids           text[],
    p_account_ids       text[],
    p_amounts           numeric[],
    p_currencies        text[],
    p_auth_types        text[],
    p_fingerprints      text[],
    p_correlation_ids   text[],
    p_message_ids       text[],
    p_partitions        integer[],
    p_offsets           bigint[],
    p_processed_at      timestamptz,
    p_source_topic      text,
    p_batch_id          uuid,
    p_billing_amounts   numeric[],
    p_billing_currencies text[],
    p_partial_ok        boolean[],
    p_card_ids          text[],
    p_categories        text[],
    p_countries         text[],
    p_times             text[],  -- each message's own time (ISO 8601)
    p_tz                text            -- PAYAUTH_LIMITS_TIMEZONE
) RETURNS TABLE (result text, decline_reason text, approved text, partial boolean,
                 ledger_balance text, available_balance text, account_currency text,
                 card_status text, limit_id text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    claim_period timestamptz := payauth_claim_period();  -- the claims' period, fenced
    n          integer := coalesce(array_length(p_txn_ids, 1), 0);
    ids        text[];     -- the batch's distinct accounts, in lock order
    bals       numeric[];  -- aligned with ids: the ledger balance; NULL: unknown account
    helds      numeric[];  -- what its active holds keep
    currencies text[];
    statuses   text[];
    atids      tid[];      -- where each account is, locked (NULL: unknown)
    bals0      numeric[];  -- each balance as read, to tell which ones moved
    seqscan    text;       -- the session's enable_seqscan and enable_nestloop, off for
    nestloop   text;       -- the statement that writes
    n_written  bigint;
    slot       integer[];  -- for each message, its account's position in ids
    rule       text;       -- the rule's version
    decision   text;
    amt        numeric;    -- the message's amount in its account's currency
    seen_bal   numeric[] := '{}';  -- what each decision read: the available balance
    seen_ledger numeric[] := '{}'; -- and the ledger balance (an inquiry's figure)
    seen_stat  text[] := '{}';
    seen_cur   text[] := '{}';
    results    text[] := '{}';
    reasons    text[] := '{}';
    grants     numeric[] := '{}';  -- in the account's currency; NULL for a decline
    deltas     numeric[] := '{}';
    asked      text[] := '{}';     -- a ledger entry's request fingerprint, when needed
    partials   boolean[] := '{}';  -- a partial approval (NULL otherwise)
    j          integer;
    -- The controls (payauth_batch_controls): per message, then per (message, limit) pair,
    -- then per slot (a limit in a period) the usage as the batch leaves it.
    judged     boolean;
    verdicts   text[];
    c_status   text[];
    c_expires  date[];
    c_blocks   text[];
    pfirst     integer[];
    plast      integer[];
    pmsg       integer[];
    plimit     text[];
    pstart     date[];
    pmax_amt   numeric[];
    pmax_cnt   integer[];
    qslot      integer[];
    used_amt   numeric[];
    used_cnt   integer[];
    seen_amt   numeric[];  -- per pair: the usage its decision read
    seen_cnt   integer[];
    pgrant     numeric[];  -- per pair: what the approval counted in it
    limit_ids  text[];     -- per message: the limit a LIMIT_EXCEEDED names
    verdict    text;
    room       numeric;
    croom      integer;
    s          integer;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    -- (Aggregated in one pass over rows sorted once: an ORDER BY in each aggregate would
    -- sort the accounts once per array.)
    SELECT array_agg(x.id), array_agg(x.balance), array_agg(x.held),
           array_agg(x.currency::text), array_agg(x.status), array_agg(x.tid)
      INTO ids, bals, helds, currencies, statuses, atids
      FROM (SELECT k.id, a.balance, a.held, a.currency, a.status, a.ctid AS tid
              FROM (SELECT DISTINCT unnest(p_account_ids) AS id) k
              LEFT JOIN accounts a ON a.account_id = k.id
             ORDER BY k.id) x;
    bals0 := bals;

    SELECT array_agg(s.pos ORDER BY t.ord) INTO slot
      FROM unnest(p_account_ids) WITH ORDINALITY AS t(id, ord)
      JOIN unnest(ids) WITH ORDINALITY AS s(id, pos) ON s.id = t.id;

    rule := payauth_rule_version();

    SELECT * INTO judged, verdicts, c_status, c_expires, c_blocks, pfirst, plast, pmsg, plimit,
                  pstart, pmax_amt, pmax_cnt, qslot, used_amt, used_cnt
      FROM payauth_batch_controls(p_account_ids, p_card_ids, p_categories, p_countries,
                                  p_auth_types, p_times, p_tz);
    limit_ids := array_fill(NULL::text, ARRAY[n]);
    seen_amt := array_fill(NULL::numeric, ARRAY[coalesce(cardinality(pmsg), 0)]);
    seen_cnt := array_fill(NULL::integer, ARRAY[coalesce(cardinality(pmsg), 0)]);
    pgrant := array_fill(NULL::numeric, ARRAY[coalesce(cardinality(pmsg), 0)]);

    -- Decide in offset order; each message sees the available balance the ones before it
    -- left (the ledger balance less what active holds keep), and the usage of its limits
    -- the ones before it left.
    FOR i IN 1..n LOOP
        j := slot[i];
        seen_bal[i] := bals[j] - helds[j]; seen_ledger[i] := bals[j];
        seen_stat[i] := statuses[j]; seen_cur[i] := currencies[j];
        amt := payauth_account_amount(currencies[j], p_currencies[i], p_amounts[i],
                                      p_billing_currencies[i], p_billing_amounts[i]);
        -- (Not judged: the verdict and the rooms stay NULL, never assigned.)
        IF judged THEN  -- (the same steps as payauth_authorize_lifecycle's)
            verdict := verdicts[i]; room := NULL; croom := NULL;
            FOR q IN coalesce(pfirst[i], 1)..coalesce(plast[i], 0) LOOP
                s := qslot[q];
                seen_amt[q] := used_amt[s]; seen_cnt[q] := used_cnt[s];
                room := least(room, pmax_amt[q] - used_amt[s]);
                croom := least(croom, pmax_cnt[q] - used_cnt[s]);
            END LOOP;
        END IF;
        decision := payauth_decide(seen_bal[i], statuses[j], p_auth_types[i], amt, NULL,
                                   coalesce(p_partial_ok[i], false), verdict, room, croom);
        IF decision IS NULL THEN  -- a broken rule stops the partition, it never approves
            RAISE EXCEPTION 'payauth_decide returned NULL for transaction %', p_txn_ids[i];
        ELSIF decision NOT IN ('APPROVED', 'PARTIAL') THEN
            results[i] := 'DECLINED'; reasons[i] := decision; deltas[i] := 0;
            grants[i] := NULL;
        ELSE
            results[i] := 'APPROVED'; reasons[i] := NULL;
            -- (An inquiry in another currency than the account's approves no amount.)
            grants[i] := coalesce(payauth_approved(decision, amt, seen_bal[i]), 0);
            deltas[i] := CASE p_auth_types[i] WHEN 'PURCHASE' THEN -grants[i]
                                              WHEN 'REFUND' THEN grants[i] ELSE 0 END;
            bals[j] := bals[j] + deltas[i];
        END IF;
        -- The limit a LIMIT_EXCEEDED names (the first by id); what an approval counts.
        IF judged THEN
            FOR q IN coalesce(pfirst[i], 1)..coalesce(plast[i], 0) LOOP
                s := qslot[q];
                IF decision = 'LIMIT_EXCEEDED' THEN
                    IF limit_ids[i] IS NULL
                       AND (pmax_amt[q] - used_amt[s] < least(amt, seen_bal[i])
                            OR pmax_cnt[q] - used_cnt[s] < 1) THEN
                        limit_ids[i] := plimit[q];
                    END IF;
                ELSIF grants[i] IS NOT NULL AND pstart[q] IS NOT NULL THEN
                    used_amt[s] := used_amt[s] + grants[i]; used_cnt[s] := used_cnt[s] + 1;
                    pgrant[q] := grants[i];
                END IF;
            END LOOP;
        END IF;
        asked[i] := CASE WHEN deltas[i] <> 0 AND (grants[i] <> p_amounts[i]
                                                  OR currencies[j] <> p_currencies[i])
                         THEN p_fingerprints[i] END;
        partials[i] := CASE WHEN p_auth_types[i] IN ('PURCHASE', 'AUTHORIZATION')
                                 AND grants[i] < amt THEN true END;
    END LOOP;

    -- Claim the keys (the primary key serializes replicas: an INSERT of a key another open
    -- transaction inserted waits for it, then violates it), write the ledger, move balances.
    -- (The planner's scans and nested loops off for this statement: the accounts' update
    -- below.)
    seqscan := current_setting('enable_seqscan');
    nestloop := current_setting('enable_nestloop');
    PERFORM set_config('enable_seqscan', 'off', true), set_config('enable_nestloop', 'off', true);
    -- (No ON CONFLICT: a speculative insertion per row cost a sixth of the statement.)
    -- (The arrays are unnested in the select list, in step, not in FROM: a function in FROM
    -- has all its rows copied into a tuplestore before the first is read, four times the
    -- cost for thirty arrays; docs/benchmark.md. The lifecycle route does the same.)
    WITH input AS (
        SELECT unnest(p_txn_ids) AS txn_id, unnest(p_account_ids) AS account_id,
               unnest(p_amounts) AS amount, unnest(p_currencies) AS currency,
               unnest(p_auth_types) AS auth_type, unnest(results) AS result,
               unnest(reasons) AS decline_reason, unnest(p_fingerprints) AS fingerprint,
               unnest(p_correlation_ids) AS correlation_id,
               unnest(p_message_ids) AS message_id, unnest(deltas) AS delta,
               unnest(p_partitions) AS source_partition, unnest(p_offsets) AS source_offset,
               unnest(seen_bal) AS input_balance, unnest(seen_stat) AS input_status,
               unnest(seen_cur) AS input_currency, unnest(p_billing_amounts) AS billing_amount,
               unnest(p_billing_currencies) AS billing_currency,
               unnest(p_partial_ok) AS partial_ok, unnest(grants) AS approved,
               unnest(seen_ledger) AS ledger_balance, unnest(asked) AS asked,
               unnest(limit_ids) AS limit_id, unnest(c_status) AS card_status,
               unnest(c_expires) AS card_expires, unnest(c_blocks) AS blocks,
               unnest(p_times) AS message_time, unnest(p_card_ids) AS card_id,
               unnest(p_categories) AS category, unnest(p_countries) AS country,
               generate_series(1::bigint, cardinality(p_txn_ids)) AS ord
    ), claimed AS (
        INSERT INTO processed_transactions
               (txn_id, dedup_period, processed_at, result, decline_reason, fingerprint,
                account_id,
                amount, currency, authorization_type, correlation_id, message_id,
                source_topic, source_partition, source_offset, batch_id, input_balance,
                input_status, input_currency, rule_version, billing_amount, billing_currency,
                partial_ok, amount_approved, ledger_balance, message_time, card_id,
                merchant_category, merchant_country, input_card_status, input_card_expires,
                input_blocks, input_limit_reads, limit_id)
        SELECT i.txn_id, claim_period, p_processed_at, i.result, i.decline_reason,
               i.fingerprint,
               i.account_id, i.amount, i.currency, i.auth_type, i.correlation_id,
               i.message_id, p_source_topic, i.source_partition, i.source_offset, p_batch_id,
               i.input_balance, i.input_status, i.input_currency, rule, i.billing_amount,
               i.billing_currency, i.partial_ok, i.approved,
               CASE WHEN i.auth_type = 'BALANCE_INQUIRY' AND i.result = 'APPROVED'
                    THEN i.ledger_balance END,
               -- What the controls judged the message on, kept where any of them applied.
               CASE WHEN i.card_id IS NOT NULL OR i.blocks IS NOT NULL OR l.lims IS NOT NULL
                    THEN i.message_time::timestamptz END,
               i.card_id,
               CASE WHEN i.card_id IS NOT NULL OR i.blocks IS NOT NULL OR l.lims IS NOT NULL
                    THEN i.category END,
               CASE WHEN i.card_id IS NOT NULL OR i.blocks IS NOT NULL OR l.lims IS NOT NULL
                    THEN i.country END,
               i.card_status, i.card_expires, string_to_array(i.blocks, ','), l.lims,
               i.limit_id
          FROM input i
          LEFT JOIN payauth_limits_read(pmsg, plimit, pstart, pmax_amt, pmax_cnt, seen_amt,
                                        seen_cnt) l ON l.ord = i.ord
    ), ledger AS (
        INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at,
                                    request_fingerprint)
        SELECT i.txn_id, i.account_id, i.delta, i.input_currency, i.auth_type, p_processed_at,
               i.asked
          FROM input i
         WHERE i.delta <> 0
    )
    -- Each account that moved, set to what the batch leaves it (locked since it was read:
    -- nobody else changed it), found where it was read: a TID scan, never a scan of the
    -- accounts nor a probe of their index per account.
    UPDATE accounts a
       SET balance = u.bal, updated_at = p_processed_at
      FROM unnest(atids, ids, bals, bals0) AS u(tid, id, bal, bal0)
     WHERE a.ctid = ANY(atids) AND a.ctid = u.tid AND a.account_id || '' = u.id
       AND u.bal <> u.bal0;
    GET DIAGNOSTICS n_written = ROW_COUNT;
    PERFORM set_config('enable_seqscan', seqscan, true),
            set_config('enable_nestloop', nestloop, true);
    IF n_written <> (SELECT count(*) FROM unnest(bals, bals0) AS t(b, b0) WHERE t.b <> t.b0)
    THEN
        RAISE EXCEPTION 'an account moved meanwhile' USING ERRCODE = 'PA409';
    END IF;
    IF judged THEN
        PERFORM payauth_limits_charge(c.under, c.txn, c.lim, c.start, c.amount)
           FROM payauth_limits_counted(pmsg, plimit, pstart, pgrant, p_txn_ids, p_auth_types,
                                       NULL) c;
    END IF;

    -- (What each row says was worked out in the loop: this statement, planned at every
    -- call as each one here is, stays a projection of arrays.)
    RETURN QUERY
    SELECT u.r, u.w,
           CASE WHEN u.a <> u.amount OR u.acur <> u.cur THEN u.a::text END,
           u.p,
           CASE WHEN u.kind = 'BALANCE_INQUIRY' AND u.r = 'APPROVED' THEN u.lb::text END,
           CASE WHEN u.kind = 'BALANCE_INQUIRY' AND u.r = 'APPROVED' THEN u.ab::text END,
           u.acur, CASE WHEN u.w = 'CARD_BLOCKED' THEN u.cs END, u.li
      FROM (SELECT unnest(results) AS r, unnest(reasons) AS w, unnest(grants) AS a,
                   unnest(p_amounts) AS amount, unnest(seen_cur) AS acur,
                   unnest(p_currencies) AS cur, unnest(p_auth_types) AS kind,
                   unnest(seen_ledger) AS lb, unnest(seen_bal) AS ab, unnest(partials) AS p,
                   unnest(c_status) AS cs, unnest(limit_ids) AS li,
                   generate_series(1::bigint, cardinality(p_txn_ids)) AS k) u
     ORDER BY u.k;
END
$$;

REVOKE ALL ON FUNCTION payauth_authorize_purchases FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_authorize_purchases TO payauth_worker;
