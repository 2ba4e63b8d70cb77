-- payauth_rule_version: the decision rule's version, recorded with each decision and
-- compared by `payauth replay --shadow`: the first 12 hex digits of the md5 of the sources
-- of the rule's four functions (sql/payauth_decide.sql, sql/payauth_account_amount.sql,
-- sql/payauth_approved.sql, sql/payauth_card_verdict.sql), in that order, so that every change of the rule is a new
-- version. Read from the catalog at each call (a session outlives a migration), by
-- PL/pgSQL: its query, which has no parameters, is planned once a session, where a SQL
-- function's would be planned again at every batch.
CREATE OR REPLACE FUNCTION payauth_rule_version() RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN (SELECT left(md5(string_agg(p.prosrc, '' ORDER BY r.ord)), 12)
              FROM unnest(ARRAY['payauth_decide', 'payauth_account_amount',
                                'payauth_approved', 'payauth_card_verdict']) WITH ORDINALITY AS r(name, ord)
              JOIN pg_proc p ON p.proname = r.name
                            AND p.pronamespace = 'public'::regnamespace);
END
$$;

REVOKE ALL ON FUNCTION payauth_rule_version FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_rule_version TO payauth_worker;
