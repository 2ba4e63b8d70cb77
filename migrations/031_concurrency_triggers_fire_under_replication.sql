-- The triggers that make a write of the controls, or a new account, wait for the batches it
-- concerns (migrations 027 and 029) fire also where the session replays changes
-- (session_replication_role = replica): a logical replication subscription applying a
-- core banking system's card statuses, limits, blocks or accounts into this database, as a
-- bank may feed them, writes in that mode, and an ordinary (ENABLE) trigger does not fire
-- there. Without them such a write committed while a batch deciding for its account was
-- open, and that batch, which read the controls before, committed after it. So too the one
-- that gives a new account its opening balance (a feed may name only the contract's
-- columns). (The triggers that keep an account's history stay ordinary: they stand where
-- foreign keys stood, which a replica session does not check either.)
ALTER TABLE cards ENABLE ALWAYS TRIGGER cards_changed_behind_their_accounts;
ALTER TABLE spending_limits ENABLE ALWAYS TRIGGER spending_limits_changed_behind_their_accounts;
ALTER TABLE card_blocks ENABLE ALWAYS TRIGGER card_blocks_changed_behind_their_accounts;
ALTER TABLE accounts ENABLE ALWAYS TRIGGER accounts_added_behind_the_fence;
ALTER TABLE accounts ENABLE ALWAYS TRIGGER accounts_opening_balance;
