-- payauth_partitions: the partitions of a table partitioned by a time range (the dedup
-- store, the spending limits' charges), each with its bounds as times: lower NULL for one
-- from MINVALUE, both NULL for the default partition. Read from the catalog, as the
-- partitions are when the caller asks.
CREATE OR REPLACE FUNCTION payauth_partitions(p_table regclass)
RETURNS TABLE (name text, lower timestamptz, upper timestamptz)
LANGUAGE sql STABLE
AS $$
SELECT c.relname::text,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = p_table
$$;

REVOKE ALL ON FUNCTION payauth_partitions FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_partitions TO payauth_worker;
