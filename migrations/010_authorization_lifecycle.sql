-- The authorization lifecycle (CONTRACT.md, "Authorization lifecycle"): holds placed by
-- AUTHORIZATION and ADVICE, released by REVERSAL, ended by CLEARING or by expiry.
--
-- A hold is keyed by the transaction_id of the message that placed it; a REVERSAL or
-- CLEARING names it in original_transaction_id. What a hold keeps is in holds.remaining;
-- accounts.held is its running sum per account (the copy the decision reads, on the row it
-- locks anyway; `payauth verify` holds the two equal). A hold's end (reversed to zero,
-- cleared, expired) is a conditional UPDATE that finds it still ACTIVE, under the lock of
-- its account row, in the transaction that writes the deciding message's dedup record, so
-- two paths (a clearing and an expiry run) cannot both end it.
--
-- Nothing here is purged with the dedup records: holds, lifecycle_messages (one row per
-- message of the four kinds, what it applied) and orphan_reversals are what a redelivery
-- after the purge is recognised by (as the ledger's unique txn_id recognises a purchase),
-- and what a hold needs to know of the messages that changed it.

-- Available = balance - held. Only ADVICE and CLEARING may take it below zero, and only a
-- CLEARING the ledger balance: the balance CHECK allows a negative balance now, and
-- `payauth verify` says which accounts may have one.
ALTER TABLE accounts ADD COLUMN held numeric NOT NULL DEFAULT 0
    CHECK (held <> 'NaN' AND held >= 0);
ALTER TABLE accounts DROP CONSTRAINT accounts_balance_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_balance_check
    CHECK (balance <> 'NaN' AND balance <> 'Infinity' AND balance <> '-Infinity');

-- A CLEARING posts a debit, a REVERSAL of a PURCHASE a credit; holds never write here.
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_type_check;
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_type_check
    CHECK (type IN ('PURCHASE', 'REFUND', 'CLEARING', 'REVERSAL'));
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_sign_check
    CHECK ((type IN ('PURCHASE', 'CLEARING') AND amount < 0)
           OR (type IN ('REFUND', 'REVERSAL') AND amount > 0));

ALTER TABLE processed_transactions DROP CONSTRAINT processed_transactions_authorization_type_check;
ALTER TABLE processed_transactions ADD CONSTRAINT processed_transactions_authorization_type_check
    CHECK (authorization_type IN ('PURCHASE', 'REFUND', 'AUTHORIZATION', 'ADVICE', 'REVERSAL',
                                  'CLEARING'));
-- What a REVERSAL or CLEARING named and applied, for its event (rebuilt byte for byte on a
-- republication): NULL for the other kinds. amount_applied: what a REVERSAL released or
-- credited, what a CLEARING released from its hold, what an AUTHORIZATION/ADVICE placed.
ALTER TABLE processed_transactions
    ADD COLUMN original_txn_id text,
    ADD COLUMN amount_applied  numeric,
    ADD COLUMN forced          boolean,
    ADD COLUMN orphan          boolean;

CREATE TABLE holds (
    txn_id        text PRIMARY KEY CHECK (txn_id ~ '^[!-~]{1,64}$'),
    account_id    text NOT NULL REFERENCES accounts (account_id),
    currency      char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    kind          text NOT NULL CHECK (kind IN ('AUTHORIZATION', 'ADVICE')),
    amount        numeric NOT NULL  -- as authorized
                  CHECK (amount <> 'NaN' AND amount > 0 AND amount <= 999999999999999),
    remaining     numeric NOT NULL CHECK (remaining >= 0 AND remaining <= amount),
    state         text NOT NULL CHECK (state IN ('ACTIVE', 'REVERSED', 'CLEARED', 'EXPIRED')),
    placed_at     timestamptz NOT NULL DEFAULT now(),  -- the database's clock: expiry's
    ended_at      timestamptz,
    ended_by      text,     -- the REVERSAL or CLEARING that ended it; NULL for an expiry
    released      numeric,  -- what the end released (an expiry's amount_released)
    -- The HoldExpired event's outbox: set once Kafka acknowledged it; `payauth holds expire`
    -- publishes every expired hold still NULL here, on this run or the next.
    expiry_published_at timestamptz,
    CHECK ((state = 'ACTIVE') = (ended_at IS NULL)),
    CHECK (state = 'ACTIVE' OR remaining = 0)
);
CREATE INDEX holds_active_placed_at_idx ON holds (placed_at) WHERE state = 'ACTIVE';
CREATE INDEX holds_account_idx ON holds (account_id);
CREATE INDEX holds_expiry_unpublished_idx ON holds (ended_at)
    WHERE state = 'EXPIRED' AND expiry_published_at IS NULL;

-- One row per message of the four lifecycle kinds, as decided: never purged.
CREATE TABLE lifecycle_messages (
    txn_id          text PRIMARY KEY,
    kind            text NOT NULL
                    CHECK (kind IN ('AUTHORIZATION', 'ADVICE', 'REVERSAL', 'CLEARING')),
    account_id      text NOT NULL,
    amount          numeric NOT NULL,
    currency        char(3) NOT NULL,
    fingerprint     text NOT NULL,
    original_txn_id text,
    result          text NOT NULL CHECK (result IN ('APPROVED', 'DECLINED')),
    decline_reason  text,
    amount_applied  numeric,
    forced          boolean,
    orphan          boolean,
    ended_hold      boolean NOT NULL DEFAULT false,  -- this message ended its original's hold
    correlation_id  text,
    processed_at    timestamptz NOT NULL,
    decided_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lifecycle_messages_original_idx ON lifecycle_messages (original_txn_id)
    WHERE original_txn_id IS NOT NULL;

-- A REVERSAL whose original was not known yet: WAITING until the original arrives, then
-- APPLIED (to a hold, in the transaction that placed it) or VOID (the original was
-- declined, or is of another account or currency: nothing changes).
CREATE TABLE orphan_reversals (
    txn_id          text PRIMARY KEY,
    original_txn_id text NOT NULL,
    account_id      text NOT NULL,
    currency        char(3) NOT NULL,
    amount          numeric NOT NULL CHECK (amount > 0),
    state           text NOT NULL CHECK (state IN ('WAITING', 'APPLIED', 'VOID')),
    applied         numeric,
    arrived_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz
);
CREATE INDEX orphan_reversals_waiting_idx ON orphan_reversals (original_txn_id)
    WHERE state = 'WAITING';

-- balance: the ledger balance; held: what active holds keep; available = balance - held.
CREATE VIEW account_balances AS
SELECT a.account_id, a.balance,
       coalesce(h.held, 0) AS held,
       a.balance - coalesce(h.held, 0) AS available
  FROM accounts a
  LEFT JOIN (SELECT account_id, sum(remaining) AS held FROM holds
              WHERE state = 'ACTIVE' GROUP BY account_id) h ON h.account_id = a.account_id;

-- The rule, for every kind. PURCHASE and REFUND decide as in 007 (the same CASE, in the
-- same order, for them). REVERSAL is never declined (what it releases is capped by what
-- remains, below); ADVICE and CLEARING are never declined past the available balance nor
-- for the account's status, only for an unknown account or another currency than the
-- account's (a hold or a posting in another currency cannot be netted against it).
CREATE OR REPLACE FUNCTION payauth_decide(
    balance          numeric,  -- the account's available balance; NULL: no such account
    status           text,
    account_currency text,
    currency         text,     -- the request's
    auth_type        text,
    amount           numeric
) RETURNS text  -- 'APPROVED' or the decline reason
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN auth_type = 'REVERSAL' THEN 'APPROVED'
        WHEN balance IS NULL THEN 'UNKNOWN_ACCOUNT'
        WHEN auth_type IN ('ADVICE', 'CLEARING') AND account_currency = currency
            THEN 'APPROVED'
        WHEN status <> 'ACTIVE' THEN 'ACCOUNT_BLOCKED'
        WHEN account_currency <> currency THEN 'CURRENCY_MISMATCH'
        WHEN auth_type = 'REFUND' THEN 'APPROVED'
        WHEN balance < amount THEN 'INSUFFICIENT_FUNDS'
        ELSE 'APPROVED'
    END
$$;

-- payauth_authorize as in 009, deciding on the available balance (balance - held): the
-- batches of PURCHASE and REFUND only (payauth_lifecycle takes any batch with another kind).
-- The input_balance it records is that available balance.
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

    -- Lock the accounts in one order (account_id), so that two batches never deadlock.
    PERFORM 1 FROM accounts WHERE account_id = ANY(p_account_ids)
     ORDER BY account_id FOR UPDATE;

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

-- A batch with any lifecycle kind (PURCHASE and REFUND among them too, so that every
-- message of an account is decided in offset order): one message at a time, each seeing
-- what the ones before it did (balances, holds, orphans). The same arrays as
-- payauth_authorize, and each message's original_transaction_id. mismatch: why a REVERSAL
-- or CLEARING names an original it cannot (LIFECYCLE_MISMATCH); such a message is not
-- claimed and changes nothing.
CREATE OR REPLACE FUNCTION payauth_lifecycle(
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
    p_batch_id         uuid,
    p_originals        text[]
) RETURNS TABLE (result text, decline_reason text, amount_applied text, forced boolean,
                 orphan boolean, mismatch text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    n          integer := coalesce(array_length(p_txn_ids, 1), 0);
    rule       text := payauth_rule_version();
    txn        text;
    kind       text;
    acct       text;
    cur        text;
    amt        numeric;
    orig       text;
    a          record;   -- the account as it is now
    h          record;   -- the original's hold (when has_hold)
    has_hold   boolean;
    o          record;
    avail      numeric;
    decision   text;
    res        text;
    reason     text;
    applied    numeric;
    is_forced  boolean;
    is_orphan  boolean;
    ended      boolean;
    why        text;
    delta      numeric;  -- to the ledger balance
    hold_delta numeric;  -- to accounts.held
    placed     numeric;
    orig_type  text;     -- the original when it is no hold
    orig_acct  text;
    orig_cur   text;
    orig_amt   numeric;
    orig_res   text;
    reversed   numeric;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    -- The same lock order as payauth_authorize and the expiry (account_id).
    PERFORM 1 FROM accounts WHERE account_id = ANY(p_account_ids)
     ORDER BY account_id FOR UPDATE;

    FOR i IN 1..n LOOP
        txn := p_txn_ids[i]; acct := p_account_ids[i]; cur := p_currencies[i];
        kind := p_auth_types[i]; amt := p_amounts[i]; orig := p_originals[i];
        applied := NULL; is_forced := NULL; is_orphan := NULL; ended := false; why := NULL;
        delta := 0; hold_delta := 0; has_hold := false; orig_type := NULL;
        orig_res := NULL;

        SELECT balance, held, status, currency::text AS currency INTO a
          FROM accounts WHERE account_id = acct;
        avail := CASE WHEN FOUND THEN a.balance - a.held END;

        -- What the original is: a hold, a posted PURCHASE (or another posting), a declined
        -- authorization or purchase, or nothing known yet.
        IF orig IS NOT NULL THEN
            SELECT * INTO h FROM holds WHERE txn_id = orig FOR UPDATE;
            has_hold := FOUND;
            IF has_hold THEN
                orig_type := h.kind; orig_acct := h.account_id; orig_cur := h.currency;
                orig_res := 'APPROVED';
            ELSE
                SELECT l.type, l.account_id, l.currency::text, -l.amount
                  INTO orig_type, orig_acct, orig_cur, orig_amt
                  FROM ledger_entries l WHERE l.txn_id = orig;
                IF FOUND THEN
                    orig_res := 'APPROVED';
                ELSE
                    SELECT m.kind, m.account_id, m.currency::text, m.result
                      INTO orig_type, orig_acct, orig_cur, orig_res
                      FROM lifecycle_messages m WHERE m.txn_id = orig;
                    IF NOT FOUND THEN
                        SELECT p.authorization_type, p.account_id, p.currency::text, p.result
                          INTO orig_type, orig_acct, orig_cur, orig_res
                          FROM processed_transactions p WHERE p.txn_id = orig;
                    END IF;
                END IF;
            END IF;
            IF orig_type IS NOT NULL THEN
                IF orig_type IN ('REFUND', 'REVERSAL', 'CLEARING') THEN
                    why := format('the original %s is a %s', orig, orig_type);
                ELSIF kind = 'CLEARING' AND orig_type = 'PURCHASE' THEN
                    why := format('the original %s is a PURCHASE (posted already)', orig);
                ELSIF orig_acct <> acct THEN
                    why := format('the original %s is of another account', orig);
                ELSIF orig_cur <> cur THEN
                    why := format('the original %s is in %s', orig, orig_cur);
                END IF;
            END IF;
        END IF;
        IF why IS NOT NULL THEN
            result := NULL; decline_reason := NULL; amount_applied := NULL; forced := NULL;
            orphan := NULL; mismatch := why;
            RETURN NEXT;
            CONTINUE;
        END IF;

        decision := payauth_decide(avail, a.status, a.currency, cur, kind, amt);
        IF decision IS NULL THEN  -- a broken rule stops the partition, it never approves
            RAISE EXCEPTION 'payauth_decide returned NULL for transaction %', txn;
        END IF;
        res := CASE WHEN decision = 'APPROVED' THEN 'APPROVED' ELSE 'DECLINED' END;
        reason := CASE WHEN decision = 'APPROVED' THEN NULL ELSE decision END;

        IF res = 'APPROVED' AND kind = 'PURCHASE' THEN
            delta := -amt;
        ELSIF res = 'APPROVED' AND kind = 'REFUND' THEN
            delta := amt;
        ELSIF kind IN ('AUTHORIZATION', 'ADVICE') THEN
            -- Waiting orphan reversals of this one, in the order they came.
            placed := amt;
            FOR o IN SELECT * FROM orphan_reversals r
                      WHERE r.original_txn_id = txn AND r.state = 'WAITING'
                      ORDER BY r.arrived_at, r.txn_id FOR UPDATE LOOP
                IF res <> 'APPROVED' OR o.account_id <> acct OR o.currency <> cur THEN
                    UPDATE orphan_reversals SET state = 'VOID', applied = 0, resolved_at = now()
                     WHERE txn_id = o.txn_id;
                ELSE
                    UPDATE orphan_reversals
                       SET state = 'APPLIED', applied = least(o.amount, placed),
                           resolved_at = now()
                     WHERE txn_id = o.txn_id;
                    placed := placed - least(o.amount, placed);
                END IF;
            END LOOP;
            IF res = 'APPROVED' THEN
                INSERT INTO holds (txn_id, account_id, currency, kind, amount, remaining, state,
                                   ended_at, released)
                VALUES (txn, acct, cur, kind, amt, placed,
                        CASE WHEN placed > 0 THEN 'ACTIVE' ELSE 'REVERSED' END,
                        CASE WHEN placed > 0 THEN NULL ELSE now() END,
                        CASE WHEN placed > 0 THEN NULL ELSE amt END)
                    ON CONFLICT (txn_id) DO NOTHING;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'hold % placed already', txn USING ERRCODE = 'PA409';
                END IF;
                hold_delta := placed;
                applied := placed;
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
                END IF;
            ELSIF orig_type = 'PURCHASE' AND orig_res = 'APPROVED' THEN
                SELECT coalesce(sum(m.amount_applied), 0) INTO reversed
                  FROM lifecycle_messages m
                 WHERE m.original_txn_id = orig AND m.kind = 'REVERSAL';
                applied := greatest(least(amt, orig_amt - reversed), 0);
                delta := applied;
            ELSIF orig_type IS NULL THEN
                is_orphan := true;
                INSERT INTO orphan_reversals (txn_id, original_txn_id, account_id, currency,
                                              amount, state)
                VALUES (txn, orig, acct, cur, amt, 'WAITING')
                    ON CONFLICT (txn_id) DO NOTHING;
            END IF;
            -- else: the original was declined: a reversal of it changes nothing
        ELSIF kind = 'CLEARING' AND res = 'APPROVED' THEN
            is_forced := NOT has_hold;
            applied := 0;
            IF has_hold AND h.state = 'ACTIVE' THEN
                applied := h.remaining;
                ended := true;
                UPDATE holds
                   SET remaining = 0, state = 'CLEARED', ended_at = now(), ended_by = txn,
                       released = h.remaining
                 WHERE txn_id = orig AND state = 'ACTIVE';
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'hold % ended meanwhile', orig USING ERRCODE = 'PA409';
                END IF;
                hold_delta := -applied;
            END IF;
            delta := -amt;
        END IF;

        -- The claim and the dedup record (with the inputs the decision read).
        INSERT INTO processed_transactions
               (txn_id, processed_at, result, decline_reason, fingerprint, account_id,
                amount, currency, authorization_type, correlation_id, message_id,
                source_topic, source_partition, source_offset, batch_id, input_balance,
                input_status, input_currency, rule_version, original_txn_id, amount_applied,
                forced, orphan)
        VALUES (txn, p_processed_at, res, reason, p_fingerprints[i], acct, amt, cur, kind,
                p_correlation_ids[i], p_message_ids[i], p_source_topic, p_partitions[i],
                p_offsets[i], p_batch_id, avail, a.status, a.currency, rule, orig, applied,
                is_forced, is_orphan)
            ON CONFLICT (txn_id) DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'claim of % lost: another replica decided first', txn
                  USING ERRCODE = 'PA409';
        END IF;
        IF kind NOT IN ('PURCHASE', 'REFUND') THEN
            INSERT INTO lifecycle_messages
                   (txn_id, kind, account_id, amount, currency, fingerprint, original_txn_id,
                    result, decline_reason, amount_applied, forced, orphan, ended_hold,
                    correlation_id, processed_at)
            VALUES (txn, kind, acct, amt, cur, p_fingerprints[i], orig, res, reason, applied,
                    is_forced, is_orphan, ended, p_correlation_ids[i], p_processed_at)
                ON CONFLICT (txn_id) DO NOTHING;
            IF NOT FOUND THEN  -- decided before the dedup record was purged
                RAISE EXCEPTION 'lifecycle message % decided already', txn
                      USING ERRCODE = 'PA409';
            END IF;
        END IF;
        IF delta <> 0 THEN
            INSERT INTO ledger_entries (txn_id, account_id, amount, currency, type, created_at)
            VALUES (txn, acct, delta, cur, kind, p_processed_at)
                ON CONFLICT (txn_id) DO NOTHING;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'ledger entry % written already', txn USING ERRCODE = 'PA409';
            END IF;
        END IF;
        IF delta <> 0 OR hold_delta <> 0 THEN
            UPDATE accounts
               SET balance = balance + delta, held = held + hold_delta,
                   updated_at = p_processed_at
             WHERE account_id = acct;
        END IF;

        result := res; decline_reason := reason; amount_applied := applied::text;
        forced := is_forced; orphan := is_orphan; mismatch := NULL;
        RETURN NEXT;
    END LOOP;
END
$$;

-- `payauth holds expire --execute`: ends, as EXPIRED, the active holds placed at least
-- p_hours ago by the database's clock (now(): this transaction's start), up to p_limit
-- holds' accounts per call. The accounts are locked first, in the order every writer uses,
-- so a worker deciding a clearing of the same hold waits or is waited for; the UPDATE finds
-- each hold still ACTIVE or skips it (a hold already ended, by a message or another run).
-- Returns the holds it ended.
CREATE OR REPLACE FUNCTION payauth_expire_holds(p_hours numeric, p_limit integer)
RETURNS TABLE (txn_id text, account_id text, currency text, released text,
               ended_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    cutoff timestamptz := now() - p_hours * interval '1 hour';
    ids    text[];
BEGIN
    SELECT array_agg(DISTINCT s.account_id) INTO ids
      FROM (SELECT h.account_id FROM holds h
             WHERE h.state = 'ACTIVE' AND h.placed_at <= cutoff
             ORDER BY h.placed_at LIMIT p_limit) s;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM accounts a WHERE a.account_id = ANY(ids) ORDER BY a.account_id FOR UPDATE;
    RETURN QUERY
    WITH ended AS (
        UPDATE holds h
           SET state = 'EXPIRED', ended_at = now(), released = h.remaining, remaining = 0
         WHERE h.account_id = ANY(ids) AND h.state = 'ACTIVE' AND h.placed_at <= cutoff
        RETURNING h.txn_id, h.account_id, h.currency::text AS currency, h.released,
                  h.ended_at
    ), moved AS (
        UPDATE accounts a SET held = a.held - e.released, updated_at = now()
          FROM (SELECT e.account_id, sum(e.released) AS released FROM ended e
                 GROUP BY e.account_id) e
         WHERE a.account_id = e.account_id
        RETURNING 1
    )
    SELECT e.txn_id, e.account_id, e.currency, e.released::text, e.ended_at FROM ended e;
END
$$;

REVOKE ALL ON FUNCTION payauth_lifecycle FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_lifecycle TO payauth_worker;
REVOKE ALL ON FUNCTION payauth_expire_holds FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_expire_holds TO payauth_worker;

GRANT UPDATE (held) ON accounts TO payauth_worker;
GRANT SELECT ON account_balances TO payauth_worker;
GRANT SELECT, INSERT ON holds TO payauth_worker;
GRANT UPDATE (remaining, state, ended_at, ended_by, released, expiry_published_at)
    ON holds TO payauth_worker;
GRANT SELECT, INSERT ON lifecycle_messages TO payauth_worker;
GRANT SELECT, INSERT ON orphan_reversals TO payauth_worker;
GRANT UPDATE (state, applied, resolved_at) ON orphan_reversals TO payauth_worker;
