-- A poll's fences behind a transaction pooler (connect(pooler="transaction")). load_fences keeps them, and
-- whether they were all clean, in settings of the session, for the read sent with it and for the next
-- poll of the same topic; behind a transaction pooler the session serves other clients between
-- transactions (of other schemas of the database too), so a client there keeps them in settings of the
-- transaction: a poll's statements run in one transaction, which is all the read needs. They are computed
-- at every poll (the clean state of an earlier poll is not at hand).
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE FUNCTION {schema}.load_fences_local(p_topic_id integer, p_partitions integer[], p_seq regclass)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT set_config('pgstreams.poll_fences',
                      p_topic_id || ':' || {schema}.partition_fences(p_topic_id, p_partitions, p_seq)::text,
                      true)::void;
$$;
