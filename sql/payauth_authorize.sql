-- payauth_authorize: the one statement that decides a batch (service/adapters/postgres.py
-- calls it for every batch, whatever its kinds), and the one place that chooses how.
--
-- The batch is the worker's, in offset order within each partition: one array element per
-- message (p_originals: each one's original_transaction_id, NULL for none; the network's
-- conversion, p_billing_amounts and p_billing_currencies; a PURCHASE's or AUTHORIZATION's
-- p_partial_ok; a CLEARING's p_final, NULL meaning final; the card and merchant the controls
-- judge, p_card_ids, p_categories and p_countries, and each message's own time, p_times,
-- whose period its limits count in, in the time zone p_tz). The call
-- commits on its own (autocommit): one round trip, the accounts' locks held for the
-- statement only. In this order:
--
-- 0. Take the claim's fence and its period (payauth_claim_period), before any row lock;
--    a transaction_id of the batch that a claim of the period before committed since the
--    worker's lookup is found there: its claim is lost (answered so, nothing of it written).
-- 1. Lock the batch's accounts, in account_id order (every writer locks in this order, so
--    two batches never deadlock). From here on nothing of these accounts changes under the
--    batch, and whatever another batch wrote of them is committed and seen: an orphan
--    reversal kept by a batch still open on the same account is waited for, not missed.
--    An account not there stays so until the batch commits (payauth_accounts_fence; a
--    batch that finds one added while it locked is refused, SQLSTATE 40001, and retried).
-- 2. Choose the route, from what is locked (the only place a route is chosen):
--    * purchases (payauth_authorize_purchases): only PURCHASE, REFUND, VERIFICATION and
--      BALANCE_INQUIRY (partial approvals and conversions among them), and no orphan
--      reversal nor early clearing waits for any of them (the loop voids a clearing that
--      came before the purchase it names); set-based.
--    * lifecycle (payauth_authorize_lifecycle): the lifecycle's common path, set-based:
--      no orphan reversal nor early clearing waits for a message of the batch; every
--      ADVICE, REVERSAL, CLEARING and INCREMENTAL of a known account with an amount in its
--      currency; every message that names an original names a hold found, or an
--      AUTHORIZATION/ADVICE earlier in the batch, of its own account; no hold placed twice.
--      (The route finds the second and third itself, from the accounts and holds it reads
--      anyway, and hands the accounts of the messages without them back, SQLSTATE PAOFF,
--      before it writes anything: the batch is split then.)
--    * each (payauth_authorize_each): anything else (an orphan kept or applied, a clearing
--      before its hold kept or applied, a reversal of a purchase, a LIFECYCLE_MISMATCH, an
--      advice or clearing of an unknown account or with no amount in its currency, an
--      increment of an unknown hold, a hold placed again, a reversal that gives back to a
--      spending limit before a message of its account that a limit may count), one message
--      at a time; it holds every rule, the others the common cases of them
--      (integration/sql/test_payauth_authorize.py holds the routes to the same rows).
--    * split: a batch with such messages among others. The loop decides the messages of
--      the accounts that need it (payauth_loop_accounts), the lifecycle route the rest,
--      in the same statement; the rows come back in the batch's order. (A backlog's
--      batches are large: one such message would otherwise send hundreds to the loop.)
-- 3. The route decides in offset order (split: each account's messages in their order)
--    with the one rule (payauth_decide), claims each transaction_id under the primary key
--    of processed_transactions (txn_id, the period), writes the ledger, the holds and the
--    dedup records with the inputs each decision read, and moves the balances. A key of
--    these tables that another replica wrote first is violated: the route's writes are
--    undone, the keys of the batch decided meanwhile are answered lost, and the rest
--    decided again, from step 2, the accounts still locked (one lost claim costs its own
--    message, not the batch). A key violated that no decision holds: SQLSTATE PA409, the
--    whole statement rolled back.
--
-- First a row for each claim lost (claim_lost: its transaction_id, every other column
-- NULL; nothing of it written here: the worker looks it up again). Then one row per
-- message decided, in the batch's order: its result and decline reason; amount_applied
-- (what a REVERSAL released or credited, what a CLEARING released, what an AUTHORIZATION
-- or ADVICE placed, what an INCREMENTAL added); forced (a CLEARING with no hold to end);
-- orphan (a REVERSAL kept until its original comes); mismatch (why the message names an
-- original it cannot, or has no amount in its account's currency: not claimed, nothing
-- changed, dead-lettered LIFECYCLE_MISMATCH); balance_delta and held_delta (what the
-- message itself changed, for its event; NULL on the purchases route, where its kind and
-- what was approved say it: service/domain/events.py); approved (what was approved in the
-- account's currency: on the purchases route only when it is not the amount as sent) and
-- partial (a partial approval); ledger_balance and available_balance (a
-- BALANCE_INQUIRY's figures); account_currency (NULL: no such account); already_cleared
-- (what clearings that came before a hold released of it); applied_ids, applied_amounts and applied_correlations (the orphan
-- reversals this message's arrival applied, each with what it released or credited, for
-- their ReversalApplied events); card_status (a CARD_BLOCKED's card's status) and limit_id
-- (the limit a LIMIT_EXCEEDED names).
CREATE OR REPLACE FUNCTION payauth_authorize(
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
    p_times              text[],  -- ISO 8601, read only where a control applies
    p_tz                 text
) RETURNS TABLE (result text, decline_reason text, amount_applied text, forced boolean,
                 orphan boolean, mismatch text, balance_delta text, held_delta text,
                 approved text, partial boolean, ledger_balance text,
                 available_balance text, account_currency text, already_cleared text,
                 applied_ids text[], applied_amounts text[], applied_correlations text[],
                 card_status text, limit_id text, claim_lost text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    n            integer := coalesce(array_length(p_txn_ids, 1), 0);
    route        text;
    claim_period timestamptz;
    violated     text;  -- the table whose key a route's INSERT violated
    failure      text;  -- its SQLSTATE
    lost         text[];     -- keys of the batch another transaction decided first
    kept         integer[];  -- the positions of the messages left to decide
    slow         text[];     -- on route split: the accounts whose messages the loop decides
    one_by_one   integer[];  -- their messages' positions
    fast         integer[];  -- and the others', which the lifecycle route decides
    off          text;       -- the accounts the lifecycle route handed back (an array's text)
    locked       bigint;     -- how many of the batch's accounts were there to lock
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;

    claim_period := payauth_claim_period();
    lost := ARRAY(SELECT p.txn_id FROM processed_transactions p
                   WHERE p.dedup_period >= payauth_dedup_period(claim_period
                                                                - interval '1 microsecond')
                     AND p.dedup_period < claim_period
                     AND p.txn_id = ANY(p_txn_ids));

    PERFORM 1 FROM accounts WHERE account_id = ANY(p_account_ids)
     ORDER BY account_id FOR UPDATE;
    GET DIAGNOSTICS locked = ROW_COUNT;
    -- An account named and not there stays so until the batch commits: an insert waits
    -- (payauth_accounts_fence). One an insert added before the fence was taken here (under
    -- way, waited for, or just committed) would be locked out of account_id order, which
    -- could deadlock with a batch that locked it in order: the statement is refused
    -- instead, and the worker's retry locks it in order.
    IF locked < (SELECT count(DISTINCT a.id) FROM unnest(p_account_ids) AS a(id)) THEN
        PERFORM payauth_accounts_fence(false);
        IF (SELECT count(*) FROM accounts WHERE account_id = ANY(p_account_ids)) > locked THEN
            RAISE EXCEPTION 'an account of the batch was added while it locked its accounts'
                  USING ERRCODE = '40001', HINT = 'retried: it is locked in order then';
        END IF;
    END IF;

    <<decide>>
    LOOP
    -- Claims lost (to a claim of the period before, found above; to a key a route violated,
    -- below): a row for each, and the rest of the batch without them.
    IF cardinality(lost) > 0 THEN
        RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::boolean, NULL::boolean,
                            NULL::text, NULL::text, NULL::text, NULL::text, NULL::boolean,
                            NULL::text, NULL::text, NULL::text, NULL::text, NULL::text[],
                            NULL::text[], NULL::text[], NULL::text, NULL::text, t.txn
                       FROM unnest(lost) AS t(txn);
        kept := ARRAY(SELECT t.i FROM unnest(p_txn_ids) WITH ORDINALITY AS t(txn, i)
                       WHERE coalesce(t.txn <> ALL(lost), true) ORDER BY t.i);
        IF cardinality(kept) = 0 THEN
            RETURN;
        END IF;
        p_txn_ids := payauth_elements(p_txn_ids, kept);
        p_account_ids := payauth_elements(p_account_ids, kept);
        p_amounts := payauth_elements(p_amounts, kept);
        p_currencies := payauth_elements(p_currencies, kept);
        p_auth_types := payauth_elements(p_auth_types, kept);
        p_fingerprints := payauth_elements(p_fingerprints, kept);
        p_correlation_ids := payauth_elements(p_correlation_ids, kept);
        p_message_ids := payauth_elements(p_message_ids, kept);
        p_partitions := payauth_elements(p_partitions, kept);
        p_offsets := payauth_elements(p_offsets, kept);
        p_originals := payauth_elements(p_originals, kept);
        p_billing_amounts := payauth_elements(p_billing_amounts, kept);
        p_billing_currencies := payauth_elements(p_billing_currencies, kept);
        p_partial_ok := payauth_elements(p_partial_ok, kept);
        p_final := payauth_elements(p_final, kept);
        p_card_ids := payauth_elements(p_card_ids, kept);
        p_categories := payauth_elements(p_categories, kept);
        p_countries := payauth_elements(p_countries, kept);
        p_times := payauth_elements(p_times, kept);
        lost := '{}';
        route := NULL;
        slow := NULL;
    END IF;

    -- (The purchases route is chosen in the fewest steps: it is the common batch's, and
    -- each statement here is planned at every call.)
    IF route IS NULL THEN  -- (and again for the messages left after claims lost, below)
    IF p_auth_types <@ '{PURCHASE,REFUND,VERIFICATION,BALANCE_INQUIRY}'::text[]
       AND NOT EXISTS (SELECT 1 FROM orphan_reversals r
                        WHERE r.state = 'WAITING' AND r.original_txn_id = ANY(p_txn_ids))
       AND NOT EXISTS (SELECT 1 FROM early_clearings e
                        WHERE e.state = 'WAITING' AND e.original_txn_id = ANY(p_txn_ids)) THEN
        route := 'purchases';
    ELSE
        -- The accounts whose messages only the loop decides (payauth_loop_accounts, the one
        -- home of that rule: an orphan reversal or a clearing before its hold waiting, a
        -- reversal that gives back to a spending limit before a message of its account
        -- that a limit may count, a transaction_id twice, a hold found already, an
        -- original of another account). None: the lifecycle route decides the batch.
        -- (An ADVICE, REVERSAL, CLEARING or INCREMENTAL of an unknown account or with no
        -- amount in its currency, and an original that is neither a hold of the message's
        -- account nor an AUTHORIZATION or ADVICE of it earlier in the batch, are found by
        -- the lifecycle route itself, from the accounts and holds it reads anyway: it hands
        -- their accounts back, SQLSTATE PAOFF, and the batch is split, below.)
        slow := payauth_loop_accounts(p_txn_ids, p_account_ids, p_auth_types, p_originals,
                                      p_card_ids);
        route := CASE WHEN slow = '{}' THEN 'lifecycle' ELSE 'split' END;
    END IF;
    END IF;
    -- Only the accounts that need the loop go there: the rest of the batch is decided
    -- set-based beside them, by the lifecycle route (payauth_loop_accounts: which, and why
    -- the accounts may be split so). A batch where none is left for one side or the other
    -- is decided whole by its route.
    IF route = 'split' THEN
        -- (A NULL account, or one compared with a NULL, goes to the loop: never to neither.)
        one_by_one := ARRAY(SELECT t.i FROM unnest(p_account_ids) WITH ORDINALITY AS t(acct, i)
                             WHERE coalesce(t.acct = ANY(slow), true) ORDER BY t.i);
        fast := ARRAY(SELECT t.i FROM unnest(p_account_ids) WITH ORDINALITY AS t(acct, i)
                       WHERE NOT coalesce(t.acct = ANY(slow), true) ORDER BY t.i);
        IF one_by_one = '{}' OR fast = '{}' THEN
            route := 'each';
        END IF;
    END IF;

    -- (The routes write without ON CONFLICT, whose speculative insertion per row cost a
    -- sixth of a purchase: a key another transaction claimed or wrote first is violated
    -- instead, and that is a claim lost, here for every route: a key of what they write
    -- by transaction_id, a limit's charge among them, which the loop writes before its
    -- claim. Any other key violated is a fault, raised as it is. A row RETURN QUERY has
    -- handed on is not taken back when the block is undone: each route is a PL/pgSQL
    -- function returning a set, which runs to its end before its first row is handed on,
    -- so a route that raises has handed on none.)
    BEGIN
    IF route = 'purchases' THEN
        RETURN QUERY SELECT p.result, p.decline_reason, NULL::text, NULL::boolean,
                            NULL::boolean, NULL::text, NULL::text, NULL::text, p.approved,
                            p.partial, p.ledger_balance, p.available_balance,
                            p.account_currency, NULL::text, NULL::text[], NULL::text[],
                            NULL::text[], p.card_status, p.limit_id, NULL::text
          FROM payauth_authorize_purchases(
                   p_txn_ids, p_account_ids, p_amounts, p_currencies, p_auth_types,
                   p_fingerprints, p_correlation_ids, p_message_ids, p_partitions,
                   p_offsets, p_processed_at, p_source_topic, p_batch_id, p_billing_amounts,
                   p_billing_currencies, p_partial_ok, p_card_ids, p_categories, p_countries,
                   p_times, p_tz) p;
    ELSIF route = 'lifecycle' THEN
        RETURN QUERY SELECT l.result, l.decline_reason, l.amount_applied, l.forced, l.orphan,
                            l.mismatch, l.balance_delta, l.held_delta, l.approved, l.partial,
                            l.ledger_balance, l.available_balance, l.account_currency,
                            l.already_cleared, NULL::text[], NULL::text[], NULL::text[],
                            l.card_status, l.limit_id, NULL::text
          FROM payauth_authorize_lifecycle(
                   p_txn_ids, p_account_ids, p_amounts, p_currencies, p_auth_types,
                   p_fingerprints, p_correlation_ids, p_message_ids, p_partitions,
                   p_offsets, p_processed_at, p_source_topic, p_batch_id, p_originals,
                   p_billing_amounts, p_billing_currencies, p_partial_ok, p_final,
                   p_card_ids, p_categories, p_countries, p_times, p_tz) l;
    ELSIF route = 'split' THEN
        -- (Each route decides its own accounts' messages in their order; the rows are put
        -- back in the batch's order by position.)
        RETURN QUERY
        SELECT x.result, x.decline_reason, x.amount_applied, x.forced, x.orphan, x.mismatch,
               x.balance_delta, x.held_delta, x.approved, x.partial, x.ledger_balance,
               x.available_balance, x.account_currency, x.already_cleared, x.applied_ids,
               x.applied_amounts, x.applied_correlations, x.card_status, x.limit_id,
               NULL::text
          FROM (SELECT fast[l.ordinality], l.result, l.decline_reason, l.amount_applied,
                       l.forced, l.orphan, l.mismatch, l.balance_delta, l.held_delta,
                       l.approved, l.partial, l.ledger_balance, l.available_balance,
                       l.account_currency, l.already_cleared, NULL::text[], NULL::text[],
                       NULL::text[], l.card_status, l.limit_id
                  FROM payauth_authorize_lifecycle(
                           payauth_elements(p_txn_ids, fast),
                           payauth_elements(p_account_ids, fast),
                           payauth_elements(p_amounts, fast),
                           payauth_elements(p_currencies, fast),
                           payauth_elements(p_auth_types, fast),
                           payauth_elements(p_fingerprints, fast),
                           payauth_elements(p_correlation_ids, fast),
                           payauth_elements(p_message_ids, fast),
                           payauth_elements(p_partitions, fast),
                           payauth_elements(p_offsets, fast), p_processed_at,
                           p_source_topic, p_batch_id, payauth_elements(p_originals, fast),
                           payauth_elements(p_billing_amounts, fast),
                           payauth_elements(p_billing_currencies, fast),
                           payauth_elements(p_partial_ok, fast),
                           payauth_elements(p_final, fast),
                           payauth_elements(p_card_ids, fast),
                           payauth_elements(p_categories, fast),
                           payauth_elements(p_countries, fast),
                           payauth_elements(p_times, fast), p_tz) WITH ORDINALITY l
                UNION ALL
                SELECT one_by_one[e.ordinality], e.result, e.decline_reason,
                       e.amount_applied, e.forced, e.orphan, e.mismatch, e.balance_delta,
                       e.held_delta, e.approved, e.partial, e.ledger_balance,
                       e.available_balance, e.account_currency, e.already_cleared,
                       e.applied_ids, e.applied_amounts, e.applied_correlations,
                       e.card_status, e.limit_id
                  FROM payauth_authorize_each(
                           payauth_elements(p_txn_ids, one_by_one),
                           payauth_elements(p_account_ids, one_by_one),
                           payauth_elements(p_amounts, one_by_one),
                           payauth_elements(p_currencies, one_by_one),
                           payauth_elements(p_auth_types, one_by_one),
                           payauth_elements(p_fingerprints, one_by_one),
                           payauth_elements(p_correlation_ids, one_by_one),
                           payauth_elements(p_message_ids, one_by_one),
                           payauth_elements(p_partitions, one_by_one),
                           payauth_elements(p_offsets, one_by_one), p_processed_at,
                           p_source_topic, p_batch_id,
                           payauth_elements(p_originals, one_by_one),
                           payauth_elements(p_billing_amounts, one_by_one),
                           payauth_elements(p_billing_currencies, one_by_one),
                           payauth_elements(p_partial_ok, one_by_one),
                           payauth_elements(p_final, one_by_one),
                           payauth_elements(p_card_ids, one_by_one),
                           payauth_elements(p_categories, one_by_one),
                           payauth_elements(p_countries, one_by_one),
                           payauth_elements(p_times, one_by_one), p_tz) WITH ORDINALITY e
               ) AS x (pos, result, decline_reason, amount_applied, forced, orphan, mismatch,
                       balance_delta, held_delta, approved, partial, ledger_balance,
                       available_balance, account_currency, already_cleared, applied_ids,
                       applied_amounts, applied_correlations, card_status, limit_id)
         ORDER BY x.pos;
    ELSE
        RETURN QUERY SELECT e.*, NULL::text FROM payauth_authorize_each(
                   p_txn_ids, p_account_ids, p_amounts, p_currencies, p_auth_types,
                   p_fingerprints, p_correlation_ids, p_message_ids, p_partitions,
                   p_offsets, p_processed_at, p_source_topic, p_batch_id, p_originals,
                   p_billing_amounts, p_billing_currencies, p_partial_ok, p_final,
                   p_card_ids, p_categories, p_countries, p_times, p_tz) e;
    END IF;
    EXIT decide;
    EXCEPTION
    WHEN SQLSTATE 'PAOFF' THEN  -- the lifecycle route's: nothing written
        IF route NOT IN ('lifecycle', 'split') THEN
            RAISE;
        END IF;
        -- The accounts of its messages off its path go to the loop, with those that
        -- payauth_loop_accounts sends there (asked again: what was committed since the
        -- route's choice counts too), and the rest to the lifecycle route again.
        GET STACKED DIAGNOSTICS off = PG_EXCEPTION_DETAIL;
        slow := payauth_loop_accounts(p_txn_ids, p_account_ids, p_auth_types, p_originals,
                                      p_card_ids)
                || coalesce(nullif(off, '')::text[], p_account_ids);
        route := 'split';
    WHEN unique_violation OR SQLSTATE 'PA409' THEN  -- (the loop's: a write found its key)
        GET STACKED DIAGNOSTICS violated = TABLE_NAME, failure = RETURNED_SQLSTATE;
        -- (A partitioned table's violation names the partition.)
        IF failure <> 'PA409' AND violated NOT IN ('ledger_entries', 'holds',
                                                   'lifecycle_messages')
           AND violated NOT LIKE 'processed\_transactions%'
           AND violated NOT LIKE 'limit\_charges%' THEN
            RAISE;
        END IF;
        -- The INSERT that found a key taken waited until the transaction that wrote it
        -- committed, so this query sees it, with every other key of the batch decided
        -- since the worker's lookup (where the lookup finds a decision:
        -- PostgresStore.load_stored). Those claims are lost: answered so, nothing of them
        -- written here (the route's writes were undone back to BEGIN, the accounts' locks
        -- kept), and the rest decided on the route chosen for them. Each turn leaves out
        -- one message at least, or none can be named (a hold alone, a hold ended
        -- meanwhile): then the whole batch is refused, the worker's retry looks it up again.
        lost := ARRAY(SELECT t.txn FROM unnest(p_txn_ids) AS t(txn)
                       WHERE EXISTS (SELECT 1 FROM processed_transactions x
                                      WHERE x.txn_id = t.txn)
                          OR EXISTS (SELECT 1 FROM lifecycle_messages x WHERE x.txn_id = t.txn)
                          OR EXISTS (SELECT 1 FROM ledger_entries x WHERE x.txn_id = t.txn));
        IF cardinality(lost) = 0 AND failure = 'PA409' THEN
            RAISE;
        ELSIF cardinality(lost) = 0 THEN
            RAISE EXCEPTION 'a transaction_id of the batch is in % already: another replica '
                            'decided it first', violated
                  USING ERRCODE = 'PA409';
        END IF;
    END;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION payauth_authorize FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_authorize TO payauth_worker;
