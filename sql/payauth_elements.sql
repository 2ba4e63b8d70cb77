-- payauth_elements: the elements of an array at these positions, in their order (NULL for a
-- NULL array). payauth_authorize keeps a batch's messages so, every array alike, when it
-- leaves out the ones whose claims another transaction won.
CREATE OR REPLACE FUNCTION payauth_elements(
    p_values    anyarray,
    p_positions integer[]  -- 1-based
) RETURNS anyarray
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_values IS NOT NULL THEN
               ARRAY(SELECT p_values[k.i] FROM unnest(p_positions) WITH ORDINALITY AS k(i, o)
                      ORDER BY k.o) END
$$;

REVOKE ALL ON FUNCTION payauth_elements FROM PUBLIC;
GRANT EXECUTE ON FUNCTION payauth_elements TO payauth_worker;
