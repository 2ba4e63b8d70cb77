-- payauth_batch_controls: what a set-based route needs of the controls to decide a batch in
-- memory, read once with the batch's accounts locked (payauth_card_inputs,
-- payauth_limit_slots). judged is false, and every array NULL, when nothing of the controls
-- can apply to the batch (no message names a card; no block and no limit of its accounts):
-- the common batch pays two index probes.
--
-- Per message (aligned with the batch): the card's verdict (payauth_card_verdict), what it
-- was judged on (status, expiry, the blocks matched, as text: 'CATEGORY,COUNTRY'), and the
-- range of its (message, limit) pairs, pair_first..pair_last (NULL: no limit counts it).
-- Per pair, in the batch's order then the limit's: the message, the limit and its period's
-- first day (NULL: a TRANSACTION limit), its maximums, and its slot: the pairs of one limit
-- and period share a slot, whose usage (slot_used_*) the route carries on through the batch.
-- (No pair at all: every pair array and pair_first/pair_last are NULL.)
CREATE OR REPLACE FUNCTION payauth_batch_controls(
    p_account_ids text[],
    p_card_ids    text[],
    p_categories  text[],
    p_countries   text[],
    p_auth_types  text[],
    p_times       text[],  -- each message's own time (ISO 8601), read only when judged
    p_tz          text,
    OUT judged           boolean,
    OUT verdicts         text[],
    OUT card_statuses    text[],
    OUT card_expiries    date[],
    OUT card_blocks      text[],
    OUT pair_first       integer[],
    OUT pair_last        integer[],
    OUT pair_msg         integer[],
    OUT pair_limit       text[],
    OUT pair_start       date[],
    OUT pair_max_amount  numeric[],
    OUT pair_max_count   integer[],
    OUT pair_slot        integer[],
    OUT slot_used_amount numeric[],
    OUT slot_used_count  integer[]
)
LANGUAGE plpgsql
AS $$
DECLARE
    times timestamptz[];
    i     integer;
BEGIN
    -- (The batch's ids joined, not compared with scope_id = ANY(…): each statement is planned
    -- for its own values (adapters/postgres.py), and the planner estimates = ANY of a batch's
    -- thousand ids one by one against the column's most common values (a limit's scope_id
    -- repeats), which cost a batch 2.5 ms on spending_limits; an unnest it estimates at
    -- once. The other statements that ask whether a limit or a block names any of the
    -- batch's ids do the same.)
    judged := EXISTS (SELECT 1 FROM unnest(p_card_ids) AS c(id) WHERE c.id IS NOT NULL)
              OR EXISTS (SELECT 1 FROM unnest(p_account_ids) AS a(id)
                           JOIN card_blocks b ON b.scope_id = a.id)
              OR EXISTS (SELECT 1 FROM unnest(p_account_ids) AS a(id)
                           JOIN spending_limits l ON l.scope_id = a.id);
    IF NOT judged THEN
        RETURN;
    END IF;
    times := p_times::timestamptz[];

    -- (Each array is aggregated in one pass over rows already in the batch's order: an
    -- ORDER BY in each aggregate would sort the batch once per array.)
    SELECT array_agg(payauth_card_verdict(p_card_ids[i.ord], i.card_status, i.card_expires,
                                          i.message_day, i.blocks)),
           array_agg(i.card_status), array_agg(i.card_expires),
           array_agg(array_to_string(i.blocks, ','))
      INTO verdicts, card_statuses, card_expiries, card_blocks
      FROM (SELECT * FROM payauth_card_inputs(p_account_ids, p_card_ids, p_categories,
                                              p_countries, times, p_tz) c
             ORDER BY c.ord) i;

    -- A slot is numbered by its first pair: slot_used_* are indexed as the pairs are.
    SELECT array_agg(r.ord::integer), array_agg(r.limit_id), array_agg(r.period_start),
           array_agg(r.max_amount), array_agg(r.max_count), array_agg(r.slot::integer),
           array_agg(r.used_amount), array_agg(r.used_count)
      INTO pair_msg, pair_limit, pair_start, pair_max_amount, pair_max_count, pair_slot,
           slot_used_amount, slot_used_count
      FROM (SELECT s.*, min(s.q) OVER (PARTITION BY s.limit_id, s.period_start) AS slot
              FROM payauth_limit_slots(p_account_ids, p_card_ids, p_categories, p_auth_types,
                                       times, p_tz)
                   WITH ORDINALITY AS s(ord, limit_id, period_start, max_amount, max_count,
                                        used_amount, used_count, q)
             ORDER BY s.q) r;

    IF pair_msg IS NOT NULL THEN
        pair_first := array_fill(NULL::integer, ARRAY[cardinality(p_account_ids)]);
        pair_last := pair_first;
        FOR q IN 1..cardinality(pair_msg) LOOP
            i := pair_msg[q];
            pair_first[i] := coalesce(pair_first[i], q);
            pair_last[i] := q;
        END LOOP;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION payauth_batch_controls FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_batch_controls TO payauth_worker;
