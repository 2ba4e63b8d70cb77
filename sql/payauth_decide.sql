-- payauth_decide: the decision rule, alone. Pure, no table read: given what a decision read
-- (the account's available balance, NULL when there is no such account, and its status;
-- for an INCREMENTAL, the state of the hold it names) and the request (its kind, its amount
-- in the account's currency as payauth_account_amount gives it, NULL when there is none,
-- and whether the merchant accepts a partial approval): 'APPROVED', 'PARTIAL' (approved for
-- the available balance: payauth_approved) or the decline reason, the first that applies in
-- the contract's order. The card's controls come in judged: its verdict
-- (payauth_card_verdict: the first of the card's reasons, NULL when none applies) and the
-- room its limits leave (the least of max_amount - usage and of max_count - count over the
-- limits that count the message, payauth_limit_slots; NULL when none applies). The batch
-- statements call it for each message; `payauth replay --shadow` calls it on the inputs
-- stored with each decision. Its version (payauth_rule_version) is the md5 of its source
-- and of the three rules beside it: a change
-- here is a new rule version with nothing to bump by hand.
--
-- REVERSAL is never declined (what it releases is capped by what remains). ADVICE and
-- CLEARING are never declined past the available balance nor for the account's status,
-- only for an unknown account (payauth_mismatch dead-letters those with no amount in the
-- account's currency before the rule is asked). A BALANCE_INQUIRY needs no amount in the
-- account's currency (it moves none); a VERIFICATION checks the account as a purchase would,
-- without funds. An INCREMENTAL needs its hold active; a partial approval is for PURCHASE
-- and AUTHORIZATION only, and only while something is available. The card's verdict judges
-- every kind but REFUND (ADVICE, CLEARING and REVERSAL are approved before it); a limit
-- declines what funds would approve, whole (it never approves part): the room is asked
-- only of the kinds it counts and may decline (the callers give none to the others).
--
-- A one-expression SQL function: the planner inlines it into the callers' loops.
CREATE OR REPLACE FUNCTION payauth_decide(
    balance    numeric,  -- the account's available balance; NULL: no such account
    status     text,
    auth_type  text,
    amount     numeric,  -- in the account's currency (payauth_account_amount); NULL: none
    hold_state text,     -- an INCREMENTAL's hold; NULL: no approved hold of the account
    partial_ok boolean,  -- the merchant accepts a partial approval
    card_verdict text,   -- payauth_card_verdict; NULL: nothing of the card declines
    limit_room numeric,  -- what the limits still allow; NULL: no amount limit applies
    count_room integer   -- how many more they allow; NULL: no count limit applies
) RETURNS text  -- 'APPROVED', 'PARTIAL' or the decline reason
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN auth_type = 'REVERSAL' THEN 'APPROVED'
        WHEN balance IS NULL THEN 'UNKNOWN_ACCOUNT'
        WHEN auth_type IN ('ADVICE', 'CLEARING') AND amount IS NOT NULL THEN 'APPROVED'
        WHEN status <> 'ACTIVE' THEN 'ACCOUNT_BLOCKED'
        WHEN card_verdict IS NOT NULL AND auth_type <> 'REFUND' THEN card_verdict
        WHEN auth_type = 'BALANCE_INQUIRY' THEN 'APPROVED'
        WHEN amount IS NULL THEN 'CURRENCY_MISMATCH'
        WHEN auth_type = 'INCREMENTAL' AND hold_state IS DISTINCT FROM 'ACTIVE'
            THEN 'HOLD_NOT_ACTIVE'
        WHEN auth_type IN ('REFUND', 'VERIFICATION') THEN 'APPROVED'
        WHEN balance >= amount THEN
            CASE WHEN amount > limit_room OR count_room < 1 THEN 'LIMIT_EXCEEDED'
                 ELSE 'APPROVED' END
        WHEN partial_ok AND auth_type IN ('PURCHASE', 'AUTHORIZATION') AND balance > 0 THEN
            CASE WHEN balance > limit_room OR count_room < 1 THEN 'LIMIT_EXCEEDED'
                 ELSE 'PARTIAL' END
        ELSE 'INSUFFICIENT_FUNDS'
    END
$$;

REVOKE ALL ON FUNCTION payauth_decide FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_decide TO payauth_worker;
