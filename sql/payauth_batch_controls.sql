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
BEGIN
    judged := EXISTS (SELECT 1 FROM unnest(p_card_ids) AS c(id) WHERE c.id IS NOT NULL)
              OR EXISTS (SELECT 1 FROM card_blocks b WHERE b.scope_id = ANY(p_account_ids))
              OR EXISTS (SELECT 1 FROM spending_limits l WHERE l.scope_id = ANY(p_account_ids));
    IF NOT judged THEN
        RETURN;
    END IF;

    SELECT array_agg(payauth_card_verdict(m.card, i.card_status, i.card_expires,
                                          i.message_day, i.blocks) ORDER BY i.ord),
           array_agg(i.card_status ORDER BY i.ord), array_agg(i.card_expires ORDER BY i.ord),
           array_agg(array_to_string(i.blocks, ',') ORDER BY i.ord)
      INTO verdicts, card_statuses, card_expiries, card_blocks
      FROM payauth_card_inputs(p_account_ids, p_card_ids, p_categories, p_countries,
                               p_times::timestamptz[], p_tz) i
      JOIN unnest(p_card_ids) WITH ORDINALITY AS m(card, ord) ON m.ord = i.ord;

    WITH r AS (
        SELECT s.*, row_number() OVER (ORDER BY s.ord, s.limit_id) AS q,
               dense_rank() OVER (ORDER BY s.limit_id, s.period_start) AS slot
          FROM payauth_limit_slots(p_account_ids, p_card_ids, p_categories, p_auth_types,
                                   p_times::timestamptz[], p_tz) s
    ), slots AS (
        SELECT DISTINCT ON (r.slot) r.slot, r.used_amount, r.used_count FROM r ORDER BY r.slot
    ), firsts AS (
        SELECT r.ord, min(r.q) AS first, max(r.q) AS last FROM r GROUP BY r.ord
    )
    SELECT (SELECT array_agg(f.first ORDER BY g.i)
              FROM generate_series(1, cardinality(p_account_ids)) AS g(i)
              LEFT JOIN firsts f ON f.ord = g.i),
           (SELECT array_agg(f.last ORDER BY g.i)
              FROM generate_series(1, cardinality(p_account_ids)) AS g(i)
              LEFT JOIN firsts f ON f.ord = g.i),
           (SELECT array_agg(r.ord::integer ORDER BY r.q) FROM r),
           (SELECT array_agg(r.limit_id ORDER BY r.q) FROM r),
           (SELECT array_agg(r.period_start ORDER BY r.q) FROM r),
           (SELECT array_agg(r.max_amount ORDER BY r.q) FROM r),
           (SELECT array_agg(r.max_count ORDER BY r.q) FROM r),
           (SELECT array_agg(r.slot::integer ORDER BY r.q) FROM r),
           (SELECT array_agg(s.used_amount ORDER BY s.slot) FROM slots s),
           (SELECT array_agg(s.used_count ORDER BY s.slot) FROM slots s)
      INTO pair_first, pair_last, pair_msg, pair_limit, pair_start, pair_max_amount,
           pair_max_count, pair_slot, slot_used_amount, slot_used_count;
END
$$;

REVOKE ALL ON FUNCTION payauth_batch_controls FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_batch_controls TO payauth_worker;
