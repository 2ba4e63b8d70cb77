-- Accounts loaded as the contract says: an INSERT that names only account_id, balance,
-- currency (and status) works. opening_balance, which `payauth verify` holds every balance
-- to (balance = opening_balance + ledger), is taken from the balance at insert when the
-- loader does not give it. NOT NULL is checked after BEFORE triggers, so the column keeps
-- its constraint.
CREATE OR REPLACE FUNCTION payauth_opening_balance_from_balance() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.opening_balance IS NULL THEN
        NEW.opening_balance := NEW.balance;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER accounts_opening_balance
    BEFORE INSERT ON accounts
    FOR EACH ROW EXECUTE FUNCTION payauth_opening_balance_from_balance();
