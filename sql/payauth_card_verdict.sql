-- payauth_card_verdict: what of the card declines a message, alone. Pure, no table read:
-- given the card_id the message names and what the decision read of it (its status and
-- expiry, NULL status: no such card of the message's account; payauth_card_inputs), the
-- message's own date in PAYAUTH_LIMITS_TIMEZONE and the blocks that match the message (its
-- merchant's category, its merchant's country): the first of the card's decline reasons in
-- the contract's order, NULL when none applies. payauth_decide puts it in its place among
-- the account's and the funds' reasons and says which kinds it judges; `payauth replay
-- --shadow` calls it on the inputs stored with each decision. Part of the rule's version
-- (payauth_rule_version).
CREATE OR REPLACE FUNCTION payauth_card_verdict(
    card_id     text,    -- as the message names it; NULL: a message without a card
    card_status text,    -- as read; NULL: no such card of the account
    expires_on  date,    -- the card is valid through this day; NULL: no expiry
    message_day date,    -- the message's own date, in PAYAUTH_LIMITS_TIMEZONE
    blocks      text[]   -- the kinds of block that match ('CATEGORY', 'COUNTRY')
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN card_id IS NOT NULL AND card_status IS NULL THEN 'UNKNOWN_CARD'
        WHEN card_status <> 'ACTIVE' THEN 'CARD_BLOCKED'
        WHEN expires_on < message_day THEN 'CARD_EXPIRED'
        WHEN 'CATEGORY' = ANY(blocks) THEN 'CATEGORY_BLOCKED'
        WHEN 'COUNTRY' = ANY(blocks) THEN 'COUNTRY_BLOCKED'
    END
$$;

REVOKE ALL ON FUNCTION payauth_card_verdict FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_card_verdict TO payauth_worker;
