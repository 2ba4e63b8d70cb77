-- The triggers controls_changed_behind_their_accounts (migration 029) call this before each
-- row written to cards, spending_limits or card_blocks, whoever writes it (`payauth cards
-- load|status`, `payauth limits load`, an INSERT or UPDATE by hand, a bank's own
-- application): the write takes the locks of the accounts the row concerns (a card's
-- account; a limit's or a block's, of an ACCOUNT scope its account, of a CARD scope its
-- card's, that card locked against a move meanwhile), before and after the change, as
-- every batch that decides for those accounts takes them first. A change therefore waits
-- for the batches deciding for them and applies to every message decided after it
-- commits, never to a batch under way: such a batch read the controls in its own
-- statements, each in a snapshot of its own, after it locked its accounts. (As the function's owner: a role that may write the controls may lock
-- their accounts, whatever its grants. Several rows of several accounts lock them row by
-- row: a write of many, by hand, may be refused as a deadlock with a batch, and is then
-- run again; the commands lock them in the batches' order first. A write by hand locks its
-- row before this runs, a command its accounts before its rows: the two writing the same
-- row at once may deadlock, one of them refused, nothing half done. A transaction by hand
-- left open holds its accounts' batches until it ends.)
CREATE OR REPLACE FUNCTION payauth_controls_changed_behind_their_accounts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    rows_  jsonb[] := '{}';
    r      jsonb;
    accts  text[] := '{}';
BEGIN
    IF TG_OP <> 'DELETE' THEN
        rows_ := rows_ || to_jsonb(NEW);
    END IF;
    IF TG_OP <> 'INSERT' THEN
        rows_ := rows_ || to_jsonb(OLD);
    END IF;
    FOREACH r IN ARRAY rows_ LOOP
        accts := accts || CASE
            WHEN TG_TABLE_NAME = 'cards' THEN r->>'account_id'
            WHEN r->>'scope' = 'ACCOUNT' THEN r->>'scope_id'
            -- (The card locked FOR SHARE: a move of the card to another account under
            -- way is waited for, and the account it moved to is the one locked.)
            ELSE (SELECT c.account_id FROM cards c WHERE c.card_id = r->>'scope_id'
                    FOR SHARE) END;
    END LOOP;
    PERFORM 1 FROM accounts a WHERE a.account_id = ANY(accts)
      ORDER BY a.account_id FOR UPDATE;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;
