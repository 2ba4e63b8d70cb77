-- payauth_authorize_each: payauth_authorize's route for every batch off the set-based
-- routes (sql/payauth_authorize.sql says which), called with the accounts locked: one
-- message at a time, each seeing what the ones before it wrote. It holds every rule of the
-- lifecycle and of an issuer's day (docs/lifecycle.md, "Where each rule lives"):
--
-- * LIFECYCLE_MISMATCH: payauth_mismatch's; such a message is not claimed, nothing changes.
-- * The decision: payauth_decide, on the available balance (balance - held) and the amount
--   in the account's currency (payauth_account_amount), approving what payauth_approved
--   says (a partial approval: the available balance), and on the card's controls read for
--   the message alone: its card's verdict (payauth_card_inputs, payauth_card_verdict) and
--   the room its limits leave (payauth_limit_slots). An approval a limit counts is charged
--   at once (payauth_limits_charge); whatever a reversal releases or credits, an orphan's
--   too, is given back to the limits that counted its original (payauth_limits_give_back).
-- * PURCHASE/REFUND: a debit/credit in the ledger of what was approved. Waiting orphan
--   reversals of an approved PURCHASE are applied in the order they came, each credited
--   back (capped by what of the purchase remains) as a REVERSAL ledger entry under the
--   reversal's own transaction_id; of anything else (declined, no purchase, of another
--   account or currency) they become VOID. Early clearings waiting for it become VOID.
-- * VERIFICATION and BALANCE_INQUIRY: nothing moves; an inquiry keeps the balances it read.
-- * AUTHORIZATION/ADVICE: a hold of what was approved, net of the orphan reversals and
--   the clearings that came before it (early clearings), applied in the one order they
--   came in, as if the hold had been there: a reversal releases up to what remains (the
--   hold ends REVERSED at zero), a clearing as much as it posted, a final one all that is
--   left (the hold ends CLEARED); after the end, either releases nothing. What the
--   clearings released is its amount_already_cleared.
-- * INCREMENTAL: adds what was approved to its hold, which must be active and the
--   account's (else HOLD_NOT_ACTIVE).
-- * REVERSAL: of a hold, releases up to what remains (ending it at zero); of an approved
--   PURCHASE, credits back up to what of it is not yet reversed; of an original not known
--   yet, kept WAITING in orphan_reversals; of a declined one, nothing.
-- * CLEARING: posts its amount as a debit; a final one ends its hold, releasing what
--   remains, a non-final one releases as much as it posts (capped) and the hold stays;
--   forced when no hold is named or known; one naming an original not known yet is also
--   kept in early_clearings until that original comes.
--
-- Every write checks it wrote what it meant to (a claim, a hold, a lifecycle record or a
-- ledger entry there already: SQLSTATE PA409, which payauth_authorize answers as a claim
-- lost where it can name the key, the whole statement rolled back where not). One row per
-- message, the columns of payauth_authorize: balance_delta and held_delta are what the
-- message itself changed (a hold counts net of the clearings before it; the orphan
-- reversals its arrival applied, with what each released or credited, come in applied_ids,
-- applied_amounts, applied_correlations).
CREATE OR REPLACE FUNCTION payauth_authorize_each(
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
                 applied_ids text[],
                 applied_amounts text[], applied_correlations text[],
                 card_status text, limit_id text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    claim_period timestamptz := payauth_claim_period();  -- the claims' period, fenced
    n          integer := coalesce(array_length(p_txn_ids, 1), 0);
    rule       text := payauth_rule_version();
    txn        text;
    kind       text;
    acct       text;
    cur        text;
    amt        numeric;  -- in the account's currency (payauth_account_amount)
    fin        boolean;  -- a CLEARING's final flag
    orig       text;
    a          record;   -- the account as it is now
    h          record;   -- the original's hold (when has_hold)
    has_hold   boolean;
    hold_active boolean; -- has_hold and that hold is ACTIVE
    o          record;
    avail      numeric;
    decision   text;
    res        text;
    reason     text;
    granted    numeric;  -- what was approved, in the account's currency
    applied    numeric;
    is_forced  boolean;
    is_orphan  boolean;
    ended      boolean;
    why        text;
    hold_seen  text;     -- an INCREMENTAL's hold's state, as its decision read it
    delta      numeric;  -- to the ledger balance
    hold_delta numeric;  -- to accounts.held
    placed     numeric;
    cleared    numeric;  -- what early clearings released of a hold being placed
    cleared_by text;     -- the final early clearing that ended it
    w_state    text;     -- that hold's state as what waited for it leaves it
    orig_type  text;     -- the original when it is no hold
    orig_amt   numeric;
    orig_res   text;
    reversed   numeric;
    credit     numeric;  -- to the ledger balance, by orphan reversals of a PURCHASE
    credit_ids text[];   -- those reversals, each written after the purchase's own entry
    credits    numeric[];
    c          numeric;
    o_ids      text[];   -- the orphan reversals this message's arrival applied
    o_amounts  text[];
    o_corrs    text[];
    -- The controls, read for this message alone (payauth_card_inputs, payauth_limit_slots).
    c_st       text;     -- the card's status; NULL: no card of the account
    c_exp      date;
    c_blk      text[];
    mday       date;
    verdict    text;
    room       numeric;
    croom      integer;
    e_lim      text[];   -- the limits that count it, in id order, and their periods
    e_start    date[];
    e_ma       numeric[];
    e_mc       integer[];
    e_ua       numeric[];  -- and the usage it read
    e_uc       integer[];
    lims       limit_read[];
    lim_id     text;
    judged     boolean;
    charged    boolean;  -- the approval was counted in a limit with a period (a charge)
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    FOR i IN 1..n LOOP
        txn := p_txn_ids[i]; acct := p_account_ids[i]; cur := p_currencies[i];
        kind := p_auth_types[i]; orig := p_originals[i]; fin := coalesce(p_final[i], true);
        applied := NULL; is_forced := NULL; is_orphan := NULL; ended := false; why := NULL;
        delta := 0; hold_delta := 0; credit := 0; credit_ids := '{}'; credits := '{}';
        has_hold := false; hold_active := false; orig_type := NULL; granted := NULL; hold_seen := NULL;
        orig_res := NULL; o_ids := NULL; o_amounts := NULL; o_corrs := NULL;
        cleared := NULL; cleared_by := NULL;

        SELECT balance, held, status, currency::text AS currency INTO a
          FROM accounts WHERE account_id = acct;
        avail := CASE WHEN FOUND THEN a.balance - a.held END;
        amt := CASE WHEN avail IS NULL THEN p_amounts[i]  -- no account: as sent
                    ELSE payauth_account_amount(a.currency, cur, p_amounts[i],
                                                p_billing_currencies[i],
                                                p_billing_amounts[i]) END;

        -- What the original is: a hold, a posted PURCHASE, a declined authorization or
        -- purchase, or nothing known yet (whether it fits is asked below).
        IF orig IS NOT NULL THEN
            -- (A hold of the message's own account locked, the batch holds that account's
            -- lock; one of another account only read: it ends in a decline or a mismatch,
            -- and locking it would wait for, or deadlock with, that account's batch.)
            SELECT * INTO h FROM holds WHERE txn_id = orig AND account_id = acct FOR UPDATE;
            has_hold := FOUND;
            IF NOT has_hold THEN
                SELECT * INTO h FROM holds WHERE txn_id = orig;
                has_hold := FOUND;
            END IF;
            IF has_hold THEN
                orig_type := h.kind; orig_res := 'APPROVED'; hold_active := h.state = 'ACTIVE';
            ELSE
                SELECT l.type, -l.amount INTO orig_type, orig_amt
                  FROM ledger_entries l WHERE l.txn_id = orig;
                IF FOUND THEN
                    orig_res := 'APPROVED';
                ELSE
                    SELECT m.kind, m.result INTO orig_type, orig_res
                      FROM lifecycle_messages m WHERE m.txn_id = orig;
                    IF NOT FOUND THEN
                        SELECT p.authorization_type, p.result INTO orig_type, orig_res
                          FROM processed_transactions p WHERE p.txn_id = orig;
                    END IF;
                END IF;
            END IF;
        END IF;
        IF kind = 'INCREMENTAL' AND has_hold THEN  -- (h is read only when it was found)
            IF h.account_id = acct THEN
                hold_seen := h.state;
            END IF;
        END IF;

        -- Whether the message fits what it names: asked after the original is read, so it
        -- sees at least what that read saw. (An original of another account is read
        -- without its lock: one its batch commits in between is a mismatch here, never
        -- released or credited on this account below.)
        why := payauth_mismatch(kind, acct, cur, p_amounts[i], p_billing_currencies[i],
                                p_billing_amounts[i], orig);
        IF why IS NOT NULL THEN
            result := NULL; decline_reason := NULL; amount_applied := NULL; forced := NULL;
            orphan := NULL; mismatch := why; balance_delta := NULL; held_delta := NULL;
            approved := NULL; partial := NULL; ledger_balance := NULL;
            available_balance := NULL; account_currency := NULL; already_cleared := NULL;
            applied_ids := NULL; applied_amounts := NULL; applied_correlations := NULL;
            card_status := NULL; limit_id := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;

        -- The card's controls, read now (every message before it on this account is
        -- written): payauth_decide says which kinds the card's verdict judges; the limits
        -- are read for the kinds they count.
        SELECT ci.card_status, ci.card_expires, ci.blocks, ci.message_day
          INTO c_st, c_exp, c_blk, mday
          FROM payauth_card_inputs(ARRAY[acct], ARRAY[p_card_ids[i]], ARRAY[p_categories[i]],
                                   ARRAY[p_countries[i]], ARRAY[p_times[i]::timestamptz], p_tz) ci;
        verdict := payauth_card_verdict(p_card_ids[i], c_st, c_exp, mday, c_blk);
        room := NULL; croom := NULL; e_lim := NULL; lims := NULL; lim_id := NULL;
        charged := false;
        IF kind IN ('PURCHASE', 'AUTHORIZATION', 'INCREMENTAL', 'ADVICE') THEN
            SELECT min(ls.max_amount - ls.used_amount), min(ls.max_count - ls.used_count),
                   array_agg(ls.limit_id ORDER BY ls.limit_id),
                   array_agg(ls.period_start ORDER BY ls.limit_id),
                   array_agg(ls.max_amount ORDER BY ls.limit_id),
                   array_agg(ls.max_count ORDER BY ls.limit_id),
                   array_agg(ls.used_amount ORDER BY ls.limit_id),
                   array_agg(ls.used_count ORDER BY ls.limit_id)
              INTO room, croom, e_lim, e_start, e_ma, e_mc, e_ua, e_uc
              FROM payauth_limit_slots(ARRAY[acct], ARRAY[p_card_ids[i]],
                                       ARRAY[p_categories[i]], ARRAY[kind], ARRAY[p_times[i]::timestamptz],
                                       p_tz) ls;
            IF e_lim IS NOT NULL THEN
                SELECT r.lims INTO lims
                  FROM payauth_limits_read(array_fill(1, ARRAY[cardinality(e_lim)]), e_lim,
                                           e_start, e_ma, e_mc, e_ua, e_uc) r;
            END IF;
        END IF;
        -- (What the controls judged the message on is kept where any of them applied.)
        judged := p_card_ids[i] IS NOT NULL OR c_blk IS NOT NULL OR e_lim IS NOT NULL;

        decision := payauth_decide(avail, a.status, kind, amt, hold_seen,
                                   coalesce(p_partial_ok[i], false), verdict, room, croom);
        IF decision IS NULL THEN  -- a broken rule stops the partition, it never approves
            RAISE EXCEPTION 'payauth_decide returned NULL for transaction %', txn;
        END IF;
        IF decision IN ('APPROVED', 'PARTIAL') THEN
            res := 'APPROVED'; reason := NULL;
            granted := coalesce(payauth_approved(decision, amt, avail), 0);
        ELSE
            res := 'DECLINED'; reason := decision;
        END IF;
        -- The limit a LIMIT_EXCEEDED names (the first by id); what an approval counts (before
        -- the orphan reversals below give any of it back).
        IF decision = 'LIMIT_EXCEEDED' THEN
            SELECT x.lim INTO lim_id
              FROM unnest(e_lim, e_ma, e_ua, e_mc, e_uc) AS x(lim, ma, ua, mc, uc)
             WHERE x.ma - x.ua < least(amt, avail) OR x.mc - x.uc < 1
             LIMIT 1;
        ELSIF res = 'APPROVED' AND e_lim IS NOT NULL THEN
            charged := cardinality(array_remove(e_start, NULL)) > 0;
            PERFORM payauth_limits_charge(
                array_fill(CASE WHEN kind = 'INCREMENTAL' THEN orig ELSE txn END,
                           ARRAY[cardinality(e_lim)]),
                array_fill(txn, ARRAY[cardinality(e_lim)]), e_lim, e_start,
                array_fill(granted, ARRAY[cardinality(e_lim)]));
        END IF;

        IF kind IN ('PURCHASE', 'REFUND', 'VERIFICATION', 'BALANCE_INQUIRY') THEN
            delta := CASE WHEN res <> 'APPROVED' THEN 0 WHEN kind = 'PURCHASE' THEN -granted
                          WHEN kind = 'REFUND' THEN granted ELSE 0 END;
            -- Waiting orphan reversals of this one, in the order they came: an approved
            -- PURCHASE is credited back up to what was approved, each credit a REVERSAL
            -- ledger entry under the reversal's own transaction_id; of anything else they
            -- change nothing.
            FOR o IN SELECT r.*, m.correlation_id FROM orphan_reversals r
                       LEFT JOIN lifecycle_messages m ON m.txn_id = r.txn_id
                      WHERE r.original_txn_id = txn AND r.state = 'WAITING'
                      ORDER BY r.arrival FOR UPDATE OF r LOOP
                IF res <> 'APPROVED' OR kind <> 'PURCHASE' OR o.account_id <> acct
                   OR o.currency::text IS DISTINCT FROM a.currency THEN
                    UPDATE orphan_reversals SET state = 'VOID', applied = 0, resolved_at = now()
                     WHERE txn_id = o.txn_id;
                ELSE
                    c := least(o.amount, granted - credit);
                    UPDATE orphan_reversals SET state = 'APPLIED', applied = c,
                                                resolved_at = now()
                     WHERE txn_id = o.txn_id;
                    o_ids := o_ids || o.txn_id; o_amounts := o_amounts || c::text;
                    o_corrs := o_corrs || o.correlation_id;
                    IF charged THEN  -- (counted just above)
                        PERFORM payauth_limits_give_back(txn, c);
                    END IF;
                    IF c > 0 THEN
                        credit_ids := credit_ids || o.txn_id;
                        credits := credits || c;
                    END IF;
                    credit := credit + c;
                END IF;
            END LOOP;
            UPDATE early_clearings SET state = 'VOID', applied = 0, resolved_at = now()
             WHERE original_txn_id = txn AND state = 'WAITING';
        ELSIF kind IN ('AUTHORIZATION', 'ADVICE') THEN
            -- What waited for this one, orphan reversals and early clearings alike, in the
            -- one order they were decided in (arrival, migration 028), each applied as it
            -- would have been had the hold been there when it came: a reversal releases up
            -- to what remains, and what remains reaching zero ends the hold REVERSED (by no
            -- message); a clearing releases as much as it posted, a final one all that
            -- remains, ending the hold CLEARED; after the hold's end, either releases
            -- nothing. (Locked first, each table in its order: FOR UPDATE reads no UNION.)
            placed := coalesce(granted, 0);
            w_state := 'ACTIVE';
            PERFORM 1 FROM orphan_reversals r
              WHERE r.original_txn_id = txn AND r.state = 'WAITING'
              ORDER BY r.arrival FOR UPDATE;
            PERFORM 1 FROM early_clearings e
              WHERE e.original_txn_id = txn AND e.state = 'WAITING'
              ORDER BY e.arrival FOR UPDATE;
            FOR o IN SELECT w.* FROM (
                         SELECT true AS is_reversal, r.txn_id, r.account_id,
                                r.currency::text AS currency, r.amount, NULL::boolean AS final,
                                r.arrival, m.correlation_id
                           FROM orphan_reversals r
                           LEFT JOIN lifecycle_messages m ON m.txn_id = r.txn_id
                          WHERE r.original_txn_id = txn AND r.state = 'WAITING'
                         UNION ALL
                         SELECT false, e.txn_id, e.account_id, e.currency::text, e.amount,
                                e.final, e.arrival, NULL
                           FROM early_clearings e
                          WHERE e.original_txn_id = txn AND e.state = 'WAITING') w
                      ORDER BY w.arrival LOOP
                IF o.is_reversal THEN
                    IF res <> 'APPROVED' OR o.account_id <> acct
                       OR o.currency IS DISTINCT FROM a.currency THEN
                        UPDATE orphan_reversals SET state = 'VOID', applied = 0,
                                                    resolved_at = now()
                         WHERE txn_id = o.txn_id;
                        CONTINUE;
                    END IF;
                    c := CASE WHEN w_state = 'ACTIVE' THEN least(o.amount, placed) ELSE 0 END;
                    UPDATE orphan_reversals SET state = 'APPLIED', applied = c,
                                                resolved_at = now()
                     WHERE txn_id = o.txn_id;
                    o_ids := o_ids || o.txn_id; o_amounts := o_amounts || c::text;
                    o_corrs := o_corrs || o.correlation_id;
                    IF charged THEN
                        PERFORM payauth_limits_give_back(txn, c);
                    END IF;
                    IF w_state = 'ACTIVE' AND placed - c = 0 THEN
                        w_state := 'REVERSED';
                    END IF;
                ELSE
                    IF res <> 'APPROVED' OR o.account_id <> acct THEN
                        UPDATE early_clearings SET state = 'VOID', applied = 0,
                                                   resolved_at = now()
                         WHERE txn_id = o.txn_id;
                        CONTINUE;
                    END IF;
                    c := CASE WHEN w_state <> 'ACTIVE' THEN 0
                              WHEN o.final THEN placed
                              ELSE least(o.amount, placed) END;
                    UPDATE early_clearings SET state = 'APPLIED', applied = c,
                                               resolved_at = now()
                     WHERE txn_id = o.txn_id;
                    cleared := coalesce(cleared, 0) + c;
                    IF w_state = 'ACTIVE' AND o.final THEN
                        w_state := 'CLEARED'; cleared_by := o.txn_id;
                    END IF;
                END IF;
                placed := placed - c;
            END LOOP;
            IF res = 'APPROVED' THEN
                INSERT INTO holds (txn_id, account_id, currency, kind, amount, remaining, state,
                                   ended_at, ended_by, released, limited)
                -- Ended at once by a final clearing before it (what it released counted in
                -- early_clearings.applied), or by orphans reversing what remained of it; a
                -- hold that non-final clearings took to zero stays active, a final one may
                -- still come.
                VALUES (txn, acct, a.currency, kind, granted, placed, w_state,
                        CASE WHEN w_state <> 'ACTIVE' THEN now() END,
                        cleared_by,
                        CASE w_state WHEN 'CLEARED' THEN 0
                                     WHEN 'REVERSED' THEN granted - coalesce(cleared, 0) END,
                        charged)
                    ON CONFLICT (txn_id) DO NOTHING;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'hold % placed already', txn USING ERRCODE = 'PA409';
                END IF;
                hold_delta := placed;
                applied := placed;
            END IF;
        ELSIF kind = 'INCREMENTAL' THEN
            IF res = 'APPROVED' THEN
                UPDATE holds SET incremented = incremented + granted,
                                 remaining = remaining + granted,
                                 limited = limited OR charged
                 WHERE txn_id = orig AND state = 'ACTIVE';
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'hold % ended meanwhile', orig USING ERRCODE = 'PA409';
                END IF;
                hold_delta := granted;
                applied := granted;
            END IF;
        ELSIF kind = 'REVERSAL' THEN
            applied := 0;
            IF has_hold THEN
                IF h.state = 'ACTIVE' THEN
                    applied := least(amt, h.remaining);
                    ended := h.remaining - applied = 0;
                    UPDATE holds
                       SET remaining = remaining - applied,
                           state = CASE WHEN ended THEN 'REVERSED' ELSE 'ACTIVE' END,
                           ended_at = CASE WHEN ended THEN now() END,
                           ended_by = CASE WHEN ended THEN txn END,
                           released = CASE WHEN ended THEN applied END
                     WHERE txn_id = orig AND state = 'ACTIVE';
                    IF NOT FOUND THEN
                        RAISE EXCEPTION 'hold % ended meanwhile', orig USING ERRCODE = 'PA409';
                    END IF;
                    hold_delta := -applied;
                    IF h.limited THEN
                        PERFORM payauth_limits_give_back(orig, applied);
                    END IF;
                END IF;
            ELSIF orig_type = 'PURCHASE' AND orig_res = 'APPROVED' THEN
                SELECT coalesce(sum(m.amount_applied), 0)
                       + coalesce((SELECT sum(r.applied) FROM orphan_reversals r
                                    WHERE r.original_txn_id = orig AND r.state = 'APPLIED'), 0)
                  INTO reversed
                  FROM lifecycle_messages m
                 WHERE m.original_txn_id = orig AND m.kind = 'REVERSAL';
                applied := greatest(least(amt, orig_amt - reversed), 0);
                delta := applied;
                PERFORM payauth_limits_give_back(orig, applied);
            ELSIF orig_type IS NULL THEN
                is_orphan := true;
                INSERT INTO orphan_reversals (txn_id, original_txn_id, account_id, currency,
                                              amount, state)
                VALUES (txn, orig, acct, coalesce(a.currency, cur), amt, 'WAITING')
                    ON CONFLICT (txn_id) DO NOTHING;
            END IF;
            -- else: the original was declined: a reversal of it changes nothing
        ELSIF kind = 'CLEARING' AND res = 'APPROVED' THEN
            is_forced := NOT has_hold;
            applied := 0;
            -- hold_active, not "has_hold AND h.state = ...": PL/pgSQL reads every variable
            -- of an expression before evaluating it, and h is unassigned until a hold is read.
            IF hold_active THEN
                applied := CASE WHEN fin THEN h.remaining ELSE least(amt, h.remaining) END;
                ended := fin;
                UPDATE holds
                   SET remaining = remaining - applied,
                       state = CASE WHEN fin THEN 'CLEARED' ELSE 'ACTIVE' END,
                       ended_at = CASE WHEN fin THEN now() END,
                       ended_by = CASE WHEN fin THEN txn END,
                       released = CASE WHEN fin THEN applied END
                 WHERE txn_id = orig AND state = 'ACTIVE';
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'hold % ended meanwhile', orig USING ERRCODE = 'PA409';
                END IF;
                hold_delta := -applied;
            ELSIF orig IS NOT NULL AND orig_type IS NULL THEN
                -- Before its hold: posted now, and kept until the hold comes.
                INSERT INTO early_clearings (txn_id, original_txn_id, account_id, currency,
                                             amount, final, state)
                VALUES (txn, orig, acct, a.currency, amt, fin, 'WAITING')
                    ON CONFLICT (txn_id) DO NOTHING;
            END IF;
            delta := -amt;
        END IF;

        -- A REVERSAL or CLEARING is nobody's original: reversals and clearings waiting for
        -- this one are void (they could not be applied to it).
        IF kind IN ('REVERSAL', 'CLEARING', 'INCREMENTAL') THEN
            UPDATE orphan_reversals SET state = 'VOID', applied = 0, resolved_at = now()
             WHERE original_txn_id = txn AND state = 'WAITING';
            UPDATE early_clearings SET state = 'VOID', applied = 0, resolved_at = now()
             WHERE original_txn_id = txn AND state = 'WAITING';
        END IF;

        -- The claim and the dedup record (with the inputs the decision read).
        INSERT INTO processed_transactions
               (txn_id, dedup_period, processed_at, result, decline_reason, fingerprint,
                account_id,
                amount, currency, authorization_type, correlation_id, message_id,
                source_topic, source_partition, source_offset, batch_id, input_balance,
                input_status, input_currency, rule_version, original_txn_id, amount_applied,
                forced, orphan, billing_amount, billing_currency, partial_ok,
                amount_approved, final, input_hold_state, ledger_balance, already_cleared,
                message_time, card_id, merchant_category, merchant_country, input_card_status,
                input_card_expires, input_blocks, input_limit_reads, limit_id)
        VALUES (txn, claim_period, p_processed_at, res, reason, p_fingerprints[i], acct,
                p_amounts[i], cur,
                kind, p_correlation_ids[i], p_message_ids[i], p_source_topic, p_partitions[i],
                p_offsets[i], p_batch_id, avail, a.status, a.currency, rule, orig, applied,
                is_forced, is_orphan, p_billing_amounts[i], p_billing_currencies[i],
                p_partial_ok[i], granted, CASE WHEN kind = 'CLEARING' THEN fin END,
                hold_seen,
                CASE WHEN kind = 'BALANCE_INQUIRY' AND res = 'APPROVED' THEN a.balance END,
                cleared, CASE WHEN judged THEN p_times[i]::timestamptz END, p_card_ids[i],
                CASE WHEN judged THEN p_categories[i] END,
                CASE WHEN judged THEN p_countries[i] END, c_st, c_exp, c_blk, lims, lim_id)
            ON CONFLICT (txn_id, dedup_period) DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'claim of % lost: another replica decided first', txn
                  USING ERRCODE = 'PA409';
        END IF;
        IF kind IN ('AUTHORIZATION', 'ADVICE', 'REVERSAL', 'CLEARING', 'INCREMENTAL') THEN
            INSERT INTO lifecycle_messages
                   (txn_id, kind, account_id, amount, currency, fingerprint, original_txn_id,
                    result, decline_reason, amount_applied, forced, orphan, ended_hold,
                    correlation_id, processed_at, final, amount_approved)
            VALUES (txn, kind, acct, p_amounts[i], cur, p_fingerprints[i], orig, res, reason,
                    applied, is_forced, is_orphan, ended, p_correlation_ids[i], p_processed_at,
                    CASE WHEN kind = 'CLEARING' THEN fin END, granted)
                ON CONFLICT (txn_id) DO NOTHING;
            IF NOT FOUND THEN  -- decided before the dedup record was purged
                RAISE EXCEPTION 'lifecycle message % decided already', txn
                      USING ERRCODE = 'PA409';
            END IF;
        END IF;
        IF delta <> 0 THEN
            INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at,
                                        request_fingerprint)
            VALUES (txn, acct, delta, a.currency, kind, p_processed_at,
                    CASE WHEN kind IN ('PURCHASE', 'REFUND')
                              AND (granted <> p_amounts[i] OR a.currency <> cur)
                         THEN p_fingerprints[i] END)
                ON CONFLICT (txn_id) DO NOTHING;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'ledger entry % written already', txn USING ERRCODE = 'PA409';
            END IF;
        END IF;
        IF credit <> 0 THEN
            INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at)
            SELECT r.id, acct, r.amount, a.currency, 'REVERSAL', p_processed_at
              FROM unnest(credit_ids, credits) WITH ORDINALITY AS r(id, amount, k)
             ORDER BY r.k
                ON CONFLICT (txn_id) DO NOTHING;
            GET DIAGNOSTICS c = ROW_COUNT;
            IF c <> cardinality(credit_ids) THEN
                RAISE EXCEPTION 'a credit of purchase % written already', txn
                      USING ERRCODE = 'PA409';
            END IF;
        END IF;
        IF delta <> 0 OR hold_delta <> 0 OR credit <> 0 THEN
            UPDATE accounts
               SET balance = balance + delta + credit, held = held + hold_delta,
                   updated_at = p_processed_at
             WHERE account_id = acct;
        END IF;

        result := res; decline_reason := reason; amount_applied := applied::text;
        forced := is_forced; orphan := is_orphan; mismatch := NULL;
        -- What the message itself changed: a hold placed counts whole (net of the clearings
        -- before it), the orphans it applied count in their own events (applied_*).
        balance_delta := delta::text;
        held_delta := (CASE WHEN kind IN ('AUTHORIZATION', 'ADVICE') AND res = 'APPROVED'
                            THEN granted - coalesce(cleared, 0) ELSE hold_delta END)::text;
        approved := granted::text;
        partial := CASE WHEN kind IN ('PURCHASE', 'AUTHORIZATION') AND granted IS NOT NULL
                        THEN granted < amt END;
        ledger_balance := CASE WHEN kind = 'BALANCE_INQUIRY' AND res = 'APPROVED'
                               THEN a.balance::text END;
        available_balance := CASE WHEN kind = 'BALANCE_INQUIRY' AND res = 'APPROVED'
                                  THEN avail::text END;
        account_currency := a.currency;
        already_cleared := cleared::text;
        applied_ids := o_ids; applied_amounts := o_amounts; applied_correlations := o_corrs;
        card_status := CASE WHEN reason = 'CARD_BLOCKED' THEN c_st END; limit_id := lim_id;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_authorize_each FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_authorize_each TO payauth_worker;
