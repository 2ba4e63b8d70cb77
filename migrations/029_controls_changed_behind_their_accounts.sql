-- A card, a spending limit or a block written by any means waits for the batches deciding
-- for the accounts it concerns, and applies to every message decided after it commits
-- (sql/payauth_controls_changed_behind_their_accounts.sql says how). The commands took
-- those locks themselves (`cards status`, `limits load`); an INSERT or UPDATE by hand, the
-- way blocks are written, took none. The function is made here, as the triggers need one,
-- letting every row through; sql/ keeps its current definition, applied in the same run.
CREATE OR REPLACE FUNCTION payauth_controls_changed_behind_their_accounts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE TRIGGER cards_changed_behind_their_accounts
    BEFORE INSERT OR UPDATE OR DELETE ON cards
    FOR EACH ROW EXECUTE FUNCTION payauth_controls_changed_behind_their_accounts();
CREATE TRIGGER spending_limits_changed_behind_their_accounts
    BEFORE INSERT OR UPDATE OR DELETE ON spending_limits
    FOR EACH ROW EXECUTE FUNCTION payauth_controls_changed_behind_their_accounts();
CREATE TRIGGER card_blocks_changed_behind_their_accounts
    BEFORE INSERT OR UPDATE OR DELETE ON card_blocks
    FOR EACH ROW EXECUTE FUNCTION payauth_controls_changed_behind_their_accounts();
