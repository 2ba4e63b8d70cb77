-- payauth_authorize_lifecycle: payauth_authorize's route for the lifecycle's common path
-- (sql/payauth_authorize.sql says which batches take it, and calls it with the accounts
-- locked): no orphan reversal or early clearing waiting. What else its path needs it finds
-- itself, from the accounts and holds it reads anyway: every original a hold found, or an
-- AUTHORIZATION/ADVICE placed earlier in the batch, of the message's own account; every
-- ADVICE, CLEARING, REVERSAL and INCREMENTAL of a known account with an amount in its
-- currency (any other kind of an unknown account or with no amount in the account's
-- currency is declined here, by payauth_decide, as the loop declines it). A batch with
-- messages off that path is handed back before anything is written, SQLSTATE PAOFF, the
-- accounts of those messages in its DETAIL (an array's text): payauth_authorize then has
-- the loop, payauth_authorize_each, decide those accounts' messages, and this route the
-- rest.
--
-- Set-based: the batch's accounts and the holds its messages name are read (and the holds
-- locked) once, every message is decided in offset order in memory (arrays), then each
-- table is written by one statement. The decision is payauth_decide's, called for each
-- message as the loop calls it, on the amount in the account's currency
-- (payauth_account_amount) and approving what payauth_approved says; the rules it applies
-- are payauth_authorize_each's for the same messages (integration/sql/
-- test_payauth_authorize.py holds the two to the same rows). The card's controls are
-- judged as payauth_authorize_purchases judges them (payauth_batch_controls read once, the
-- usage carried on in memory); what a REVERSAL released is given back to the limits that
-- counted its hold after the batch's charges, in the batch's order (payauth_authorize
-- sends a batch where a message after such a reversal could read that usage to
-- payauth_authorize_each). One row per message, the
-- columns of payauth_authorize (without the orphans: none waits on this route).
CREATE OR REPLACE FUNCTION payauth_authorize_lifecycle(
    p_txn_ids            text[],
    p_account_ids        text[],
    p_amounts            numeric[],
    p_currencies         text[],
    p_auth_types         text[],
    p_fingerprints       text[],
    p_correlation_ids    text[],
    p_message_ids        text[],
    p_partitions         integer[],
    p_offsets            bigint[],
    p_processed_at       timestamptz,
    p_source_topic       text,
    p_batch_id           uuid,
    p_originals          text[],
    p_billing_amounts    numeric[],
    p_billing_currencies text[],
    p_partial_ok         boolean[],
    p_final              boolean[],
    p_card_ids           text[],
    p_categories         text[],
    p_countries          text[],
    p_times              text[],  -- each message's own time (ISO 8601)
    p_tz                 text            -- PAYAUTH_LIMITS_TIMEZONE
) RETURNS TABLE (result text, decline_reason text, amount_applied text, forced boolean,
                 orphan boolean, mismatch text, balance_delta text, held_delta text,
                 approved text, partial boolean, ledger_balance text,
                 available_balance text, account_currency text, already_cleared text,
                 card_status text, limit_id text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    claim_period timestamptz := payauth_claim_period();  -- the claims' period, fenced
    n          integer := coalesce(array_length(p_txn_ids, 1), 0);
    rule       text;
    ids        text[];     -- the batch's distinct accounts, in lock order
    bals       numeric[];  -- aligned with ids: the ledger balance as the batch leaves it
    helds      numeric[];  -- and what its active holds keep
    curs       text[];
    stats      text[];
    atids      tid[];      -- aligned with ids: where each account is, locked (NULL: none)
    bals0      numeric[];  -- and its balance and held as read, to tell which ones moved
    helds0     numeric[];
    aslot      integer[];  -- each message's account's position in ids
    hkeys      text[];     -- the holds the batch touches: those found, then those it places
    n_found    integer;
    off        text[] := '{}';  -- the accounts of messages off this route
    hacct      text[];     -- aligned with hkeys
    hcur       text[];
    hkind      text[];
    hamt       numeric[];
    hinc       numeric[];  -- what increments added
    hrem       numeric[];
    hstate     text[];
    hby        text[];
    hrel       numeric[];
    hlim       boolean[];  -- a limit counted it (holds.limited): its reversals give back
    htids      tid[];      -- where each hold found is, locked: its UPDATE finds it there
    seqscan    text;       -- the session's enable_seqscan and enable_nestloop, off for
    nestloop   text;       -- that UPDATE alone
    gives      boolean[];  -- per message: a REVERSAL of a hold a limit had counted by then
    hlive      boolean[];  -- exists by now: found, or placed (approved) earlier in the batch
    htouched   boolean[];  -- a found hold this batch changed
    oslot      integer[];  -- each message's original's position in hkeys
    placer     integer[];  -- each hold the batch places (hkeys after n_found): its message
    pslot      integer[];  -- each AUTHORIZATION/ADVICE's own position in hkeys
    res        text[] := '{}';
    reasons    text[] := '{}';
    applied    numeric[] := '{}';
    grants     numeric[] := '{}';  -- in the account's currency; NULL for a decline
    amts       numeric[] := '{}';  -- each message's amount in its account's currency
    forced_    boolean[] := '{}';
    ended      boolean[] := '{}';
    deltas     numeric[] := '{}';
    hdeltas    numeric[] := '{}';
    seen_bal   numeric[] := '{}';
    seen_ledger numeric[] := '{}';
    seen_stat  text[] := '{}';
    seen_cur   text[] := '{}';
    seen_hold  text[] := '{}';     -- an INCREMENTAL's hold state, as its decision read it
    asked      text[] := '{}';     -- a ledger entry's request fingerprint, when needed
    j          integer;
    k          integer;
    kind       text;
    amt        numeric;
    decision   text;
    n_written  bigint;
    -- The controls, as payauth_authorize_purchases keeps them.
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
    seen_amt   numeric[];
    seen_cnt   integer[];
    pgrant     numeric[];
    limit_ids  text[];
    verdict    text;
    room       numeric;
    croom      integer;
    s          integer;
    counted    boolean := false;  -- the message's approval was counted in a limit
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    -- (Aggregated in one pass over rows sorted once: an ORDER BY in each aggregate would
    -- sort the accounts once per array.)
    SELECT array_agg(x.id), array_agg(x.balance), array_agg(x.held),
           array_agg(x.currency::text), array_agg(x.status), array_agg(x.tid)
      INTO ids, bals, helds, curs, stats, atids
      FROM (SELECT k.id, a.balance, a.held, a.currency, a.status, a.ctid AS tid
              FROM (SELECT DISTINCT unnest(p_account_ids) AS id) k
              LEFT JOIN accounts a ON a.account_id = k.id  -- unknown: NULLs, a decline
             ORDER BY k.id) x;
    bals0 := bals; helds0 := helds;
    SELECT array_agg(s.pos ORDER BY t.ord) INTO aslot
      FROM unnest(p_account_ids) WITH ORDINALITY AS t(id, ord)
      JOIN unnest(ids) WITH ORDINALITY AS s(id, pos) ON s.id = t.id;

    -- The originals that are holds of the batch's accounts, locked and read in one order
    -- (txn_id), each found by its key (a lateral probe: never a scan of the holds, which a
    -- planner's guess on a young table chose, reading every hold per batch); then the
    -- holds the batch places. (A hold of an account the batch has not locked is left
    -- alone: never waited for nor locked here, it is not found, and the loop words the
    -- message that names it. The arrays are aggregated in one pass: aligned, in the
    -- order locked.)
    SELECT coalesce(array_agg(h.txn_id), '{}'), array_agg(h.account_id),
           array_agg(h.currency::text), array_agg(h.kind), array_agg(h.amount),
           array_agg(h.incremented), array_agg(h.remaining), array_agg(h.state),
           array_agg(h.ended_by), array_agg(h.released), array_agg(h.limited),
           array_agg(h.tid)
      INTO hkeys, hacct, hcur, hkind, hamt, hinc, hrem, hstate, hby, hrel, hlim, htids
      FROM (SELECT DISTINCT o.id FROM unnest(p_originals) AS o(id)
             WHERE o.id IS NOT NULL ORDER BY o.id) o
     CROSS JOIN LATERAL (SELECT x.*, x.ctid AS tid FROM holds x
                          WHERE x.txn_id = o.id AND x.account_id = ANY(ids) FOR UPDATE) h;
    n_found := coalesce(array_length(hkeys, 1), 0);
    SELECT hkeys || coalesce(array_agg(t.id ORDER BY t.ord), '{}'),
           coalesce(array_agg(t.ord::integer ORDER BY t.ord), '{}')
      INTO hkeys, placer
      FROM unnest(p_txn_ids, p_auth_types) WITH ORDINALITY AS t(id, kind, ord)
     WHERE t.kind IN ('AUTHORIZATION', 'ADVICE');
    -- Every hold array as long as hkeys (a NULL array assigned an element would start at it).
    k := coalesce(array_length(hkeys, 1), 0) - n_found;
    hacct := coalesce(hacct, '{}') || array_fill(NULL::text, ARRAY[k]);
    hcur := coalesce(hcur, '{}') || array_fill(NULL::text, ARRAY[k]);
    hkind := coalesce(hkind, '{}') || array_fill(NULL::text, ARRAY[k]);
    hamt := coalesce(hamt, '{}') || array_fill(NULL::numeric, ARRAY[k]);
    hinc := coalesce(hinc, '{}') || array_fill(0::numeric, ARRAY[k]);
    hrem := coalesce(hrem, '{}') || array_fill(NULL::numeric, ARRAY[k]);
    hstate := coalesce(hstate, '{}') || array_fill(NULL::text, ARRAY[k]);
    hby := coalesce(hby, '{}') || array_fill(NULL::text, ARRAY[k]);
    hrel := coalesce(hrel, '{}') || array_fill(NULL::numeric, ARRAY[k]);
    hlim := coalesce(hlim, '{}') || array_fill(false, ARRAY[k]);
    hlive := array_fill(true, ARRAY[n_found]) || array_fill(false, ARRAY[k]);
    htouched := array_fill(false, ARRAY[n_found + k]);
    SELECT array_agg(s.pos ORDER BY t.ord) INTO oslot
      FROM unnest(p_originals) WITH ORDINALITY AS t(id, ord)
      LEFT JOIN unnest(hkeys) WITH ORDINALITY AS s(id, pos) ON s.id = t.id;
    SELECT array_agg(s.pos ORDER BY t.ord) INTO pslot
      FROM unnest(p_txn_ids, p_auth_types) WITH ORDINALITY AS t(id, kind, ord)
      LEFT JOIN unnest(hkeys) WITH ORDINALITY AS s(id, pos)
        ON s.id = t.id AND t.kind IN ('AUTHORIZATION', 'ADVICE') AND s.pos > n_found;

    rule := payauth_rule_version();

    SELECT * INTO judged, verdicts, c_status, c_expires, c_blocks, pfirst, plast, pmsg, plimit,
                  pstart, pmax_amt, pmax_cnt, qslot, used_amt, used_cnt
      FROM payauth_batch_controls(p_account_ids, p_card_ids, p_categories, p_countries,
                                  p_auth_types, p_times, p_tz);
    limit_ids := array_fill(NULL::text, ARRAY[n]);
    gives := array_fill(false, ARRAY[n]);
    seen_amt := array_fill(NULL::numeric, ARRAY[coalesce(cardinality(pmsg), 0)]);
    seen_cnt := array_fill(NULL::integer, ARRAY[coalesce(cardinality(pmsg), 0)]);
    pgrant := array_fill(NULL::numeric, ARRAY[coalesce(cardinality(pmsg), 0)]);

    -- Decide in offset order, in memory: each message sees the balances and holds the ones
    -- before it left. Every original is a hold found or one the batch placed earlier, of
    -- the message's account (its account is handed back otherwise); one placed earlier may
    -- have been declined: a REVERSAL of it changes nothing, a CLEARING of it is forced, an
    -- INCREMENTAL of it is declined.
    FOR i IN 1..n LOOP
        -- (The other messages of an account off the path are not decided: the batch is
        -- handed back after the loop, which finds the other accounts off it.)
        CONTINUE WHEN off <> '{}' AND p_account_ids[i] = ANY(off);
        j := aslot[i]; kind := p_auth_types[i];
        amt := payauth_account_amount(curs[j], p_currencies[i], p_amounts[i],
                                      p_billing_currencies[i], p_billing_amounts[i]);
        amts[i] := amt;
        seen_bal[i] := bals[j] - helds[j]; seen_ledger[i] := bals[j];
        seen_stat[i] := stats[j]; seen_cur[i] := curs[j];
        applied[i] := NULL; forced_[i] := NULL; ended[i] := false; grants[i] := NULL;
        deltas[i] := 0; hdeltas[i] := 0; seen_hold[i] := NULL;
        k := oslot[i];
        -- Off this route, its account's messages handed back to payauth_authorize after
        -- the loop (nothing written yet), which has the loop decide them: a kind that is
        -- never declined of an unknown account or with no amount in its currency (a
        -- decline, a mismatch or an orphan the loop words), and an original that is neither
        -- a hold of the message's account nor an AUTHORIZATION or ADVICE of it earlier in
        -- the batch.
        IF (amt IS NULL AND kind IN ('ADVICE', 'REVERSAL', 'CLEARING', 'INCREMENTAL'))
           OR (p_originals[i] IS NOT NULL
               AND (k IS NULL
                    OR (k <= n_found AND hacct[k] IS DISTINCT FROM p_account_ids[i])
                    OR (k > n_found AND (placer[k - n_found] >= i
                                         OR p_account_ids[placer[k - n_found]]
                                            IS DISTINCT FROM p_account_ids[i])))) THEN
            off := off || p_account_ids[i];
            CONTINUE;
        END IF;
        IF kind = 'INCREMENTAL' THEN
            seen_hold[i] := CASE WHEN hlive[k] AND hacct[k] = p_account_ids[i]
                                 THEN hstate[k] END;
        END IF;
        -- (Not judged: the verdict and the rooms stay NULL, never assigned.)
        IF judged THEN  -- (the same steps as payauth_authorize_purchases')
            verdict := verdicts[i]; room := NULL; croom := NULL; counted := false;
            FOR q IN coalesce(pfirst[i], 1)..coalesce(plast[i], 0) LOOP
                s := qslot[q];
                seen_amt[q] := used_amt[s]; seen_cnt[q] := used_cnt[s];
                room := least(room, pmax_amt[q] - used_amt[s]);
                croom := least(croom, pmax_cnt[q] - used_cnt[s]);
            END LOOP;
        END IF;
        decision := payauth_decide(seen_bal[i], stats[j], kind, amt, seen_hold[i],
                                   coalesce(p_partial_ok[i], false), verdict, room, croom);
        IF decision IS NULL THEN  -- a broken rule stops the partition, it never approves
            RAISE EXCEPTION 'payauth_decide returned NULL for transaction %', p_txn_ids[i];
        END IF;
        IF decision IN ('APPROVED', 'PARTIAL') THEN
            res[i] := 'APPROVED'; reasons[i] := NULL;
            grants[i] := coalesce(payauth_approved(decision, amt, seen_bal[i]), 0);
        ELSE
            res[i] := 'DECLINED'; reasons[i] := decision;
        END IF;
        IF judged THEN  -- the limit a LIMIT_EXCEEDED names; what an approval counts
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
                    pgrant[q] := grants[i]; counted := true;
                END IF;
            END LOOP;
        END IF;
        IF res[i] = 'APPROVED' AND kind = 'PURCHASE' THEN
            deltas[i] := -grants[i];
        ELSIF res[i] = 'APPROVED' AND kind = 'REFUND' THEN
            deltas[i] := grants[i];
        ELSIF kind IN ('AUTHORIZATION', 'ADVICE') THEN
            IF res[i] = 'APPROVED' THEN
                k := pslot[i];
                hacct[k] := p_account_ids[i]; hcur[k] := curs[j]; hkind[k] := kind;
                hamt[k] := grants[i]; hrem[k] := grants[i]; hstate[k] := 'ACTIVE';
                hlive[k] := true; hlim[k] := counted;
                hdeltas[i] := grants[i]; applied[i] := grants[i];
            END IF;
        ELSIF kind = 'INCREMENTAL' THEN
            IF res[i] = 'APPROVED' THEN
                hinc[k] := hinc[k] + grants[i]; hrem[k] := hrem[k] + grants[i];
                htouched[k] := k <= n_found; hlim[k] := hlim[k] OR counted;
                hdeltas[i] := grants[i]; applied[i] := grants[i];
            END IF;
        ELSIF kind = 'REVERSAL' THEN
            applied[i] := 0;
            IF hlive[k] AND hstate[k] = 'ACTIVE' THEN
                applied[i] := least(amt, hrem[k]);
                ended[i] := hrem[k] - applied[i] = 0;
                hrem[k] := hrem[k] - applied[i];
                IF ended[i] THEN
                    hstate[k] := 'REVERSED'; hby[k] := p_txn_ids[i]; hrel[k] := applied[i];
                END IF;
                htouched[k] := k <= n_found;
                hdeltas[i] := -applied[i];
                gives[i] := hlim[k];  -- as the hold stands now, not as the batch leaves it
            END IF;
        ELSIF kind = 'CLEARING' THEN
            forced_[i] := p_originals[i] IS NULL OR NOT hlive[k];
            applied[i] := 0;
            IF NOT forced_[i] AND hstate[k] = 'ACTIVE' THEN
                IF coalesce(p_final[i], true) THEN  -- ends the hold, whatever remains
                    applied[i] := hrem[k]; ended[i] := true;
                    hrel[k] := hrem[k]; hrem[k] := 0; hstate[k] := 'CLEARED';
                    hby[k] := p_txn_ids[i];
                ELSE  -- releases as much as it posts, the hold stays
                    applied[i] := least(amt, hrem[k]);
                    hrem[k] := hrem[k] - applied[i];
                END IF;
                htouched[k] := k <= n_found;
                hdeltas[i] := -applied[i];
            END IF;
            deltas[i] := -amt;
        END IF;
        -- (A lifecycle message is recognised by its lifecycle record, fingerprint and all.)
        asked[i] := CASE WHEN deltas[i] <> 0 AND kind IN ('PURCHASE', 'REFUND')
                              AND (grants[i] <> p_amounts[i] OR curs[j] <> p_currencies[i])
                         THEN p_fingerprints[i] END;
        bals[j] := bals[j] + deltas[i]; helds[j] := helds[j] + hdeltas[i];
    END LOOP;
    IF off <> '{}' THEN
        RAISE EXCEPTION 'messages of % are off the lifecycle route', off
              USING ERRCODE = 'PAOFF', DETAIL = off::text;
    END IF;

    -- The holds placed (as the batch leaves them), then the ones found that it changed: a
    -- conditional UPDATE that finds each still ACTIVE (it is locked: it is). (A statement
    -- that reads many arrays unnests them in the select list, not in FROM:
    -- payauth_authorize_purchases says why. The holds' update, joined by tid, and the
    -- statements of three arrays keep theirs in FROM.)
    INSERT INTO holds (txn_id, account_id, currency, kind, amount, incremented, remaining,
                       state, ended_at, ended_by, released, limited)
    SELECT u.id, u.acct, u.cur, u.kind, u.amt, u.inc, u.rem, u.state,
           CASE WHEN u.state <> 'ACTIVE' THEN now() END, u.by, u.rel, u.lim
      FROM (SELECT unnest(hkeys) AS id, unnest(hacct) AS acct, unnest(hcur) AS cur,
                   unnest(hkind) AS kind, unnest(hamt) AS amt, unnest(hinc) AS inc,
                   unnest(hrem) AS rem, unnest(hstate) AS state, unnest(hby) AS by,
                   unnest(hrel) AS rel, unnest(hlive) AS live, unnest(hlim) AS lim,
                   generate_series(1, cardinality(hkeys)) AS pos) u
     WHERE u.pos > n_found AND u.live;
    -- (Each where it was locked, joined by it: a TID scan of each, never a scan of the holds.
    -- Given the choice, the planner read every active hold by their index, for the batch's
    -- tids, comparing each found with each of the batch's, whenever its statistics said few
    -- were active; or every hold, while it believed reading them all cheaper than fetching
    -- the batch's: either way a cost that grows with the holds the bank keeps, not with the
    -- batch. The state and the key are read as texts no index can answer, and neither a
    -- scan of the whole table nor a nested loop is planned for this statement.)
    seqscan := current_setting('enable_seqscan');
    nestloop := current_setting('enable_nestloop');
    PERFORM set_config('enable_seqscan', 'off', true), set_config('enable_nestloop', 'off', true);
    UPDATE holds h
       SET remaining = u.rem, incremented = u.inc, state = u.state,
           ended_at = CASE WHEN u.state <> 'ACTIVE' THEN now() END,
           ended_by = u.by, released = u.rel, limited = u.lim
      FROM unnest(htids, hkeys[1:n_found], hrem[1:n_found], hinc[1:n_found],
                  hstate[1:n_found], hby[1:n_found], hrel[1:n_found], htouched[1:n_found],
                  hlim[1:n_found])
           AS u(tid, id, rem, inc, state, by, rel, touched, lim)
     WHERE h.ctid = ANY(htids) AND h.ctid = u.tid AND u.touched
       AND h.txn_id || '' = u.id AND h.state || '' = 'ACTIVE';
    GET DIAGNOSTICS n_written = ROW_COUNT;
    PERFORM set_config('enable_seqscan', seqscan, true),
            set_config('enable_nestloop', nestloop, true);
    IF n_written <> (SELECT count(*) FROM unnest(htouched[1:n_found]) AS t WHERE t) THEN
        RAISE EXCEPTION 'a hold ended meanwhile' USING ERRCODE = 'PA409';
    END IF;

    -- The claims and dedup records (with the inputs each decision read).
    INSERT INTO processed_transactions
           (txn_id, dedup_period, processed_at, result, decline_reason, fingerprint,
            account_id,
            amount, currency, authorization_type, correlation_id, message_id,
            source_topic, source_partition, source_offset, batch_id, input_balance,
            input_status, input_currency, rule_version, original_txn_id, amount_applied,
            forced, orphan, billing_amount, billing_currency, partial_ok, amount_approved,
            final, input_hold_state, ledger_balance, message_time, card_id,
            merchant_category, merchant_country, input_card_status, input_card_expires,
            input_blocks, input_limit_reads, limit_id)
    SELECT t.txn, claim_period, p_processed_at, t.res, t.reason, t.fp, t.acct, t.amt, t.cur,
           t.kind, t.corr,
           t.msg, p_source_topic, t.part, t.off, p_batch_id, t.bal, t.stat, t.acur, rule,
           t.orig, t.applied, t.forced, NULL, t.bamt, t.bcur, t.pok, t.approved,
           CASE WHEN t.kind = 'CLEARING' THEN coalesce(t.fin, true) END, t.hold,
           CASE WHEN t.kind = 'BALANCE_INQUIRY' AND t.res = 'APPROVED' THEN t.lb END,
           -- What the controls judged the message on, kept where any of them applied.
           CASE WHEN t.card IS NOT NULL OR t.blocks IS NOT NULL OR l.lims IS NOT NULL
                THEN t.mtime::timestamptz END,
           t.card,
           CASE WHEN t.card IS NOT NULL OR t.blocks IS NOT NULL OR l.lims IS NOT NULL
                THEN t.cat END,
           CASE WHEN t.card IS NOT NULL OR t.blocks IS NOT NULL OR l.lims IS NOT NULL
                THEN t.country END,
           t.cstat, t.cexp, string_to_array(t.blocks, ','), l.lims, t.lim
      FROM (SELECT unnest(p_txn_ids) AS txn, unnest(res) AS res, unnest(reasons) AS reason,
                   unnest(p_fingerprints) AS fp, unnest(p_account_ids) AS acct,
                   unnest(p_amounts) AS amt, unnest(p_currencies) AS cur,
                   unnest(p_auth_types) AS kind, unnest(p_correlation_ids) AS corr,
                   unnest(p_message_ids) AS msg, unnest(p_partitions) AS part,
                   unnest(p_offsets) AS off, unnest(seen_bal) AS bal,
                   unnest(seen_stat) AS stat, unnest(seen_cur) AS acur,
                   unnest(p_originals) AS orig, unnest(applied) AS applied,
                   unnest(forced_) AS forced, unnest(p_billing_amounts) AS bamt,
                   unnest(p_billing_currencies) AS bcur, unnest(p_partial_ok) AS pok,
                   unnest(grants) AS approved, unnest(p_final) AS fin,
                   unnest(seen_hold) AS hold, unnest(seen_ledger) AS lb,
                   unnest(p_times) AS mtime, unnest(p_card_ids) AS card,
                   unnest(p_categories) AS cat, unnest(p_countries) AS country,
                   unnest(c_status) AS cstat, unnest(c_expires) AS cexp,
                   unnest(c_blocks) AS blocks, unnest(limit_ids) AS lim,
                   generate_series(1::bigint, cardinality(p_txn_ids)) AS ord) t
      LEFT JOIN payauth_limits_read(pmsg, plimit, pstart, pmax_amt, pmax_cnt, seen_amt,
                                    seen_cnt) l ON l.ord = t.ord;
    INSERT INTO lifecycle_messages
           (txn_id, kind, account_id, amount, currency, fingerprint, original_txn_id,
            result, decline_reason, amount_applied, forced, orphan, ended_hold,
            correlation_id, processed_at, final, amount_approved)
    SELECT t.txn, t.kind, t.acct, t.amt, t.cur, t.fp, t.orig, t.res, t.reason, t.applied,
           t.forced, NULL, t.ended, t.corr, p_processed_at,
           CASE WHEN t.kind = 'CLEARING' THEN coalesce(t.fin, true) END, t.approved
      FROM (SELECT unnest(p_txn_ids) AS txn, unnest(p_auth_types) AS kind,
                   unnest(p_account_ids) AS acct, unnest(p_amounts) AS amt,
                   unnest(p_currencies) AS cur, unnest(p_fingerprints) AS fp,
                   unnest(p_originals) AS orig, unnest(res) AS res, unnest(reasons) AS reason,
                   unnest(applied) AS applied, unnest(forced_) AS forced,
                   unnest(ended) AS ended, unnest(p_correlation_ids) AS corr,
                   unnest(p_final) AS fin, unnest(grants) AS approved) t
     WHERE t.kind IN ('AUTHORIZATION', 'ADVICE', 'REVERSAL', 'CLEARING', 'INCREMENTAL');
    INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at,
                                request_fingerprint)
    SELECT t.txn, t.acct, t.delta, t.cur, t.kind, p_processed_at, t.asked
      FROM (SELECT unnest(p_txn_ids) AS txn, unnest(p_account_ids) AS acct,
                   unnest(deltas) AS delta, unnest(seen_cur) AS cur,
                   unnest(p_auth_types) AS kind, unnest(asked) AS asked) t
     WHERE t.delta <> 0;
    IF judged THEN
        PERFORM payauth_limits_charge(c.under, c.txn, c.lim, c.start, c.amount)
           FROM payauth_limits_counted(pmsg, plimit, pstart, pgrant, p_txn_ids, p_auth_types,
                                       p_originals) c;
    END IF;
    -- (In the batch's order: the unnest is read as it is. Only a reversal of a hold a limit
    -- had counted when it was decided.)
    PERFORM payauth_limits_give_back(t.orig, t.applied)
       FROM unnest(p_originals, applied, gives) AS t(orig, applied, gives)
      WHERE t.gives AND t.applied > 0;
    -- Each account that moved, set to what the batch leaves it (its lock held since it was
    -- read: nobody else changed it), found where it was read (a TID scan, as the holds').
    PERFORM set_config('enable_seqscan', 'off', true),
            set_config('enable_nestloop', 'off', true);
    UPDATE accounts a
       SET balance = u.bal, held = u.held, updated_at = p_processed_at
      FROM unnest(atids, ids, bals, helds, bals0, helds0)
           AS u(tid, id, bal, held, bal0, held0)
     WHERE a.ctid = ANY(atids) AND a.ctid = u.tid AND a.account_id || '' = u.id
       AND (u.bal <> u.bal0 OR u.held <> u.held0);
    GET DIAGNOSTICS n_written = ROW_COUNT;
    PERFORM set_config('enable_seqscan', seqscan, true),
            set_config('enable_nestloop', nestloop, true);
    IF n_written <> (SELECT count(*) FROM unnest(bals, helds, bals0, helds0) AS t(b, h, b0, h0)
                      WHERE t.b <> t.b0 OR t.h <> t.h0) THEN
        RAISE EXCEPTION 'an account moved meanwhile' USING ERRCODE = 'PA409';
    END IF;

    RETURN QUERY
    SELECT u.r, u.w, u.a::text, u.f, NULL::boolean, NULL::text, u.d::text, u.h::text,
           u.ap::text,
           CASE WHEN u.kind IN ('PURCHASE', 'AUTHORIZATION') AND u.ap IS NOT NULL
                THEN u.ap < u.amt END,
           CASE WHEN u.kind = 'BALANCE_INQUIRY' AND u.r = 'APPROVED' THEN u.lb::text END,
           CASE WHEN u.kind = 'BALANCE_INQUIRY' AND u.r = 'APPROVED' THEN u.ab::text END,
           u.acur, NULL::text, CASE WHEN u.w = 'CARD_BLOCKED' THEN u.cs END, u.li
      FROM (SELECT unnest(res) AS r, unnest(reasons) AS w, unnest(applied) AS a,
                   unnest(forced_) AS f, unnest(deltas) AS d, unnest(hdeltas) AS h,
                   unnest(grants) AS ap, unnest(p_auth_types) AS kind, unnest(amts) AS amt,
                   unnest(seen_ledger) AS lb, unnest(seen_bal) AS ab,
                   unnest(seen_cur) AS acur, unnest(c_status) AS cs,
                   unnest(limit_ids) AS li,
                   generate_series(1::bigint, cardinality(p_txn_ids)) AS k) u
     ORDER BY u.k;
END
$$;

REVOKE ALL ON FUNCTION payauth_authorize_lifecycle FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_authorize_lifecycle TO payauth_worker;
