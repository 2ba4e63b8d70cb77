-- The reversals and clearings that wait for their original (orphan_reversals,
-- early_clearings) are applied, when it comes, in the one order they were decided in,
-- whichever table keeps them: a clearing decided before a reversal of the same hold clears
-- it first, as it would have had the hold been there (sql/payauth_authorize_each.sql).
-- arrived_at cannot say it: the messages of one batch share it. A sequence numbers each
-- row as the batch statement writes it, one message at a time in the batch's order, and
-- two batches of one account one after the other (the account's lock).
CREATE SEQUENCE payauth_waiting_order AS bigint;

ALTER TABLE orphan_reversals ADD COLUMN arrival bigint;
ALTER TABLE early_clearings ADD COLUMN arrival bigint;

-- The rows of before, numbered by the time they came (arrived_at), an orphan reversal
-- before a clearing of the same time, then by transaction_id: the orphan reversals among
-- themselves as they were applied and published then (those still waiting will be applied
-- with the clearings in that one order, not all reversals first as before).
UPDATE orphan_reversals r SET arrival = o.n
  FROM (SELECT w.txn_id, w.orphan, row_number() OVER (ORDER BY w.arrived_at, w.orphan DESC,
                                                      w.txn_id) AS n
          FROM (SELECT txn_id, arrived_at, true AS orphan FROM orphan_reversals
                UNION ALL
                SELECT txn_id, arrived_at, false FROM early_clearings) w) o
 WHERE o.orphan AND o.txn_id = r.txn_id;
UPDATE early_clearings e SET arrival = o.n
  FROM (SELECT w.txn_id, w.orphan, row_number() OVER (ORDER BY w.arrived_at, w.orphan DESC,
                                                      w.txn_id) AS n
          FROM (SELECT txn_id, arrived_at, true AS orphan FROM orphan_reversals
                UNION ALL
                SELECT txn_id, arrived_at, false FROM early_clearings) w) o
 WHERE NOT o.orphan AND o.txn_id = e.txn_id;
SELECT setval('payauth_waiting_order',
              greatest((SELECT count(*) FROM orphan_reversals)
                       + (SELECT count(*) FROM early_clearings), 1));

ALTER TABLE orphan_reversals
    ALTER COLUMN arrival SET DEFAULT nextval('payauth_waiting_order'),
    ALTER COLUMN arrival SET NOT NULL;
ALTER TABLE early_clearings
    ALTER COLUMN arrival SET DEFAULT nextval('payauth_waiting_order'),
    ALTER COLUMN arrival SET NOT NULL;
ALTER SEQUENCE payauth_waiting_order OWNED BY orphan_reversals.arrival;

GRANT USAGE ON SEQUENCE payauth_waiting_order TO payauth_worker;
