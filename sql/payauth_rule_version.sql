-- payauth_rule_version: the decision rule's version, recorded with each decision and
-- compared by `payauth replay --shadow`: the first 12 hex digits of the md5 of
-- payauth_decide's source (sql/payauth_decide.sql), so that every change of the rule is a
-- new version.
CREATE OR REPLACE FUNCTION payauth_rule_version() RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT left(md5(p.prosrc), 12) FROM pg_proc p
     WHERE p.oid = to_regprocedure('payauth_decide(numeric,text,text,text,text,numeric)')
$$;

REVOKE ALL ON FUNCTION payauth_rule_version FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_rule_version TO payauth_worker;
