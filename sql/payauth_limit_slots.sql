-- payauth_limit_slots: which spending limits count a batch's messages, and in which period,
-- set-based: one row per (message, limit), in the batch's order and then the limit's id.
-- A limit counts an approved PURCHASE, AUTHORIZATION, INCREMENTAL or ADVICE of its scope
-- (scope ACCOUNT: the message's account; CARD: the message's card, when it is a card of
-- the message's account) and of its merchant category (NULL: every category). The period is
-- read from the message's own time in the limits' time zone, never from when it is
-- decided (payauth_period_start: its first day; NULL for a TRANSACTION limit, which counts
-- nothing). The usage is the limit's in that
-- period as it stands now (limit_usage); the routes carry it on in memory through a batch.
CREATE OR REPLACE FUNCTION payauth_limit_slots(
    p_account_ids text[],
    p_card_ids    text[],
    p_categories  text[],
    p_auth_types  text[],
    p_times       timestamptz[],  -- each message's own time (headers.timestamp)
    p_tz          text            -- PAYAUTH_LIMITS_TIMEZONE
) RETURNS TABLE (ord bigint, limit_id text, period_start date, max_amount numeric,
                 max_count integer, used_amount numeric, used_count integer)
LANGUAGE sql STABLE
AS $$
    -- (A card and a usage row are each one row found by its key: the lateral LIMIT 1 keeps
    -- them index probes, whatever the planner guesses of the batch's size, and the period
    -- is part of the usage row's key, never a filter over all of a limit's periods. The
    -- account's limits and the card's are two plain index scans: one condition on either
    -- scope is a bitmap of both, built per message.)
    SELECT m.ord, l.limit_id, s.period_start, l.max_amount, l.max_count,
           coalesce(u.amount, 0), coalesce(u.count, 0)
      FROM unnest(p_account_ids, p_card_ids, p_categories, p_auth_types, p_times)
               WITH ORDINALITY AS m(acct, card, cat, kind, t, ord)
      LEFT JOIN LATERAL (SELECT c.card_id FROM cards c
                          WHERE c.card_id = m.card AND c.account_id = m.acct LIMIT 1) c ON true
     CROSS JOIN LATERAL (
           SELECT a.limit_id, a.period, a.max_amount, a.max_count, a.merchant_category
             FROM spending_limits a WHERE a.scope_id = m.acct AND a.scope = 'ACCOUNT'
           UNION ALL
           SELECT k.limit_id, k.period, k.max_amount, k.max_count, k.merchant_category
             FROM spending_limits k WHERE k.scope_id = c.card_id AND k.scope = 'CARD') l
     CROSS JOIN LATERAL (
           SELECT payauth_period_start(l.period, m.t, p_tz) AS period_start) s
      LEFT JOIN LATERAL (SELECT u.amount, u.count FROM limit_usage u
                          WHERE u.limit_id = l.limit_id AND u.period_start = s.period_start
                          LIMIT 1) u ON true
     WHERE m.kind IN ('PURCHASE', 'AUTHORIZATION', 'INCREMENTAL', 'ADVICE')
       AND (l.merchant_category IS NULL OR l.merchant_category = m.cat)
     ORDER BY m.ord, l.limit_id
$$;

REVOKE ALL ON FUNCTION payauth_limit_slots FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limit_slots TO payauth_worker;
