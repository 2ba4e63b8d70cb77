-- balance: the ledger balance; held: what active holds keep; available = balance - held.
CREATE OR REPLACE VIEW account_balances AS
SELECT a.account_id, a.balance,
       coalesce(h.held, 0) AS held,
       a.balance - coalesce(h.held, 0) AS available
  FROM accounts a
  LEFT JOIN (SELECT account_id, sum(remaining) AS held FROM holds
              WHERE state = 'ACTIVE' GROUP BY account_id) h ON h.account_id = a.account_id;

GRANT SELECT ON account_balances TO payauth_worker;
