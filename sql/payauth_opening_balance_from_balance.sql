-- The trigger accounts_opening_balance (migration 005) calls this before each insert into
-- accounts: an INSERT that names only account_id, balance, currency (and status) works, and
-- opening_balance, which `payauth verify` holds every balance to, is the balance at insert.
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
