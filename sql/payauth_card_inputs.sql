-- payauth_card_inputs: what a batch's decisions read of their cards, set-based, one row per
-- message in the batch's order: the card's status and expiry when the message names a card
-- of its own account (NULL otherwise: a card of another account is no card of this one),
-- the kinds of block that match the message (a block of its account, or of its card, on its
-- merchant's category or country; NULL: none), and the message's own date in the limits'
-- time zone. payauth_card_verdict judges them. Called by the batch statement's routes with
-- the batch's accounts locked: a status change (`payauth cards status` locks the card's
-- account) is seen by every batch that locks after it commits.
CREATE OR REPLACE FUNCTION payauth_card_inputs(
    p_account_ids text[],
    p_card_ids    text[],
    p_categories  text[],
    p_countries   text[],
    p_times       timestamptz[],  -- each message's own time (headers.timestamp)
    p_tz          text            -- PAYAUTH_LIMITS_TIMEZONE
) RETURNS TABLE (ord bigint, card_status text, card_expires date, blocks text[],
                 message_day date)
LANGUAGE sql STABLE
AS $$
    SELECT m.ord, c.status, c.expires_on,
           -- (Asked once for the batch, whether any block is of its accounts or cards: most
           -- batches have none, and then no message probes the blocks.)
           CASE WHEN (SELECT EXISTS (SELECT 1 FROM unnest(p_account_ids || p_card_ids) AS s(id)
                                       JOIN card_blocks b ON b.scope_id = s.id))
                THEN (SELECT array_agg(DISTINCT b.kind ORDER BY b.kind)
                        FROM card_blocks b
                       WHERE b.scope_id IN (m.acct, c.card_id)
                         AND ((b.scope = 'ACCOUNT' AND b.scope_id = m.acct)
                              OR (b.scope = 'CARD' AND b.scope_id = c.card_id))
                         AND ((b.kind = 'CATEGORY' AND b.value = m.cat)
                              OR (b.kind = 'COUNTRY' AND b.value = m.country))) END,
           (m.t AT TIME ZONE p_tz)::date
      FROM unnest(p_account_ids, p_card_ids, p_categories, p_countries, p_times)
               WITH ORDINALITY AS m(acct, card, cat, country, t, ord)
      -- (One card by its key: the lateral LIMIT 1 keeps it an index probe, whatever the
      -- planner guesses of the batch's size.)
      LEFT JOIN LATERAL (SELECT c.card_id, c.status, c.expires_on FROM cards c
                          WHERE c.card_id = m.card AND c.account_id = m.acct LIMIT 1) c ON true
     ORDER BY m.ord
$$;

REVOKE ALL ON FUNCTION payauth_card_inputs FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_card_inputs TO payauth_worker;
