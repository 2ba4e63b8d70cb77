-- payauth_limit_charges_drop_periods: detach the spending limits' charges of the periods the
-- dedup store has dropped (payauth_dedup_drop_period): every partition of limit_charges
-- that ends before the oldest period the store still holds. A charge is what a reversal of
-- the purchase or hold it is kept under would give back; a reversal after the window finds
-- no record of its purchase, and an ended hold releases nothing, so they go, but those
-- kept under a hold that still stands: a reversal gives back what it releases of a hold
-- whatever the hold's age, so those move to the period under way first, to be looked at
-- again when that one goes (a hold ends within PAYAUTH_HOLD_EXPIRY_HOURS: a few periods
-- at most). The default partition's charges of those periods are deleted. Returns the
-- partitions detached, renamed NAME_purged: payauth_dedup_drop_purged sums what they
-- counted into purged_limit_charges and drops them, in a transaction of its own (the sum
-- reads every charge, and nothing waits for it); until then `payauth verify` counts them
-- where they are (payauth_limit_charges_detached).
--
-- The standing holds' charges are moved row by row (a reversal's give-back that holds one
-- is waited for, and its amount kept), before the table is locked. Detaching takes ACCESS
-- EXCLUSIVE on the table for a moment (the batches under way finish first, the next ones
-- wait), no longer than lock_timeout (1 s; 3 s for the partitions, locked first in the
-- mode a vacuum holds), or it is left to the next purge. (A batch that, meanwhile, gives
-- back on a hold whose charge this moved waits for this transaction while it holds the
-- table: a deadlock, ended within that second; the batch is taken again, or, where the
-- move committed first, it fails to lock the moved row and is taken again.) Never in the transaction that
-- detaches a store's period: a batch locks the store and the charges in either order (it
-- reads a reversal's charges before it claims, writes a purchase's after), and a purge
-- that held one while it waited for the other could deadlock with it.
-- Security definer: the worker's role purges without owning the table.
CREATE OR REPLACE FUNCTION payauth_limit_charges_drop_periods() RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    -- (The start of the oldest period the store holds; one from MINVALUE holds them all.)
    kept_from timestamptz := (SELECT CASE WHEN bool_or(b.lower IS NULL) THEN '-infinity'
                                          ELSE min(b.lower) END
                                FROM payauth_partitions('processed_transactions') b
                               WHERE b.upper IS NOT NULL);
    victims   text[];
    victim    text;
BEGIN
    victims := ARRAY(SELECT b.name FROM payauth_partitions('limit_charges') b
                      WHERE b.upper <= kept_from ORDER BY b.upper);
    IF victims = '{}' THEN
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', '3s', true);
    FOREACH victim IN ARRAY victims LOOP
        EXECUTE format('LOCK TABLE %I IN SHARE UPDATE EXCLUSIVE MODE', victim);
    END LOOP;
    LOCK TABLE limit_charges_default IN SHARE UPDATE EXCLUSIVE MODE;
    PERFORM set_config('lock_timeout', '1s', true);
    -- (From the standing holds that a limit counted, each probed by its key: never a read
    -- of every charge of the periods that go.)
    UPDATE limit_charges c SET dedup_period = payauth_dedup_period(payauth_dedup_clock())
      FROM holds h
     WHERE h.state = 'ACTIVE' AND h.limited
       AND c.txn_id = h.txn_id AND c.dedup_period < kept_from;
    LOCK TABLE ONLY limit_charges IN ACCESS EXCLUSIVE MODE;
    FOREACH victim IN ARRAY victims LOOP
        EXECUTE format('ALTER TABLE limit_charges DETACH PARTITION %I', victim);
        EXECUTE format('ALTER TABLE %I RENAME TO %I', victim, victim || '_purged');
        RETURN NEXT victim;
    END LOOP;
    -- (Those the default partition kept for want of their period's partition; the trigger
    -- keeps what they counted.)
    DELETE FROM limit_charges c WHERE c.dedup_period < kept_from;
END
$$;

REVOKE ALL ON FUNCTION payauth_limit_charges_drop_periods FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_limit_charges_drop_periods TO payauth_worker;
