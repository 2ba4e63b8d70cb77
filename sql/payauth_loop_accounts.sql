-- payauth_loop_accounts: the accounts of a batch whose messages only the loop
-- (payauth_authorize_each) decides, one at a time; payauth_authorize has a set-based route
-- decide the rest of the batch beside them. Asked by payauth_authorize, with the batch's
-- accounts locked, of every batch that is not of purchases alone (its route's choice: none
-- such, the lifecycle route decides the batch), of a batch of purchases an orphan reversal
-- waits for, and of a batch whose lifecycle route handed accounts back (SQLSTATE PAOFF):
-- the accounts of
--
-- * a message an orphan reversal or a clearing that came before it waits for;
-- * a REVERSAL that gives back to a spending limit (of an original a limit counted, or of
--   one a limit may count earlier in the batch: placed, or incremented) before a message
--   of its account that a limit may count, which must see the usage given back;
-- * a transaction_id twice in the batch, and an AUTHORIZATION or ADVICE whose hold is found
--   already (the loop says which claim is lost, or that the hold was placed);
-- * a message whose original is a message of the batch of another account, and of that
--   original: the loop decides both in the batch's order (an orphan voided by its
--   original after it, a mismatch before), as it would the whole batch.
--
-- The accounts are independent otherwise: a message reads and writes only its own
-- account's balance, holds and limits (a card of another account is no card of it), so
-- each account's messages decided in their order, by whichever route, decide as the loop
-- decides the whole batch (integration/sql/test_payauth_authorize.py holds them to it).
CREATE OR REPLACE FUNCTION payauth_loop_accounts(
    p_txn_ids     text[],
    p_account_ids text[],
    p_auth_types  text[],
    p_originals   text[],
    p_card_ids    text[]
) RETURNS text[]
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(array_agg(DISTINCT a.acct), '{}')
      FROM (
        SELECT t.acct
          FROM unnest(p_txn_ids, p_account_ids) AS t(txn, acct)
         WHERE EXISTS (SELECT 1 FROM orphan_reversals r
                        WHERE r.original_txn_id = t.txn AND r.state = 'WAITING')
            OR EXISTS (SELECT 1 FROM early_clearings e
                        WHERE e.original_txn_id = t.txn AND e.state = 'WAITING')
        UNION ALL
        -- (Linear in the batch: each account's last counted message is found once; whether
        -- any limit is of the batch's accounts or cards is asked once.)
        SELECT t.acct
          FROM unnest(p_auth_types, p_originals, p_account_ids)
                   WITH ORDINALITY AS t(kind, orig, acct, ord)
          JOIN (SELECT l.acct, max(l.ord) AS last
                  FROM unnest(p_auth_types, p_account_ids)
                           WITH ORDINALITY AS l(kind, acct, ord)
                 WHERE l.kind IN ('PURCHASE', 'AUTHORIZATION', 'INCREMENTAL', 'ADVICE')
                 GROUP BY l.acct) c ON c.acct = t.acct AND c.last > t.ord
         WHERE t.kind = 'REVERSAL'
           AND (EXISTS (SELECT 1 FROM limit_charges c WHERE c.txn_id = t.orig)
                OR ((SELECT EXISTS (SELECT 1 FROM unnest(p_account_ids || p_card_ids) AS s(id)
                                      JOIN spending_limits l ON l.scope_id = s.id))
                    AND EXISTS (SELECT 1 FROM unnest(p_txn_ids, p_auth_types, p_originals)
                                              WITH ORDINALITY AS e(txn, kind, orig, ord)
                                 WHERE e.txn = t.orig
                                    OR (e.ord < t.ord AND e.orig = t.orig
                                        AND e.kind = 'INCREMENTAL'))))
        UNION ALL
        SELECT t.acct
          FROM unnest(p_txn_ids, p_account_ids) AS t(txn, acct)
         WHERE t.txn IN (SELECT d.txn FROM unnest(p_txn_ids) AS d(txn)
                          GROUP BY d.txn HAVING count(*) > 1)
        UNION ALL
        -- (Each of the batch's holds probed by its key, a lateral probe: never a scan of
        -- every hold, whatever the planner guesses of a young table.)
        SELECT t.acct
          FROM unnest(p_txn_ids, p_auth_types, p_account_ids) AS t(txn, kind, acct)
         CROSS JOIN LATERAL (SELECT 1 FROM holds h WHERE h.txn_id = t.txn LIMIT 1) h
         WHERE t.kind IN ('AUTHORIZATION', 'ADVICE')
        UNION ALL
        SELECT unnest(ARRAY[t.acct, o.acct])
          FROM unnest(p_originals, p_account_ids) AS t(orig, acct)
          JOIN unnest(p_txn_ids, p_account_ids) AS o(txn, acct)
            ON o.txn = t.orig AND o.acct <> t.acct
      ) a
$$;

REVOKE ALL ON FUNCTION payauth_loop_accounts FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_loop_accounts TO payauth_worker;
