-- The status read at scale, when every topic changed since the last read (each must be read again):
--
--   status_partitions(ids, from)  now reads each topic's unsealed segments (those holding positions at or
--                                 after p_from) directly, not through the topic's partitioned table:
--                                 planning a query over a leaf costs less than over the partitioned table
--                                 (about 80 against 95 us per topic, warm; far less on a new connection,
--                                 which need not load every segment of every topic)
--   status_sizes(ids)             per topic, the size of its segments' data: the main fork of each
--                                 segment's table, of its indexes and of its TOAST table and index, without
--                                 the free space and visibility maps, which pg_total_relation_size() adds
--                                 at the price of looking up every fork of every relation (30 against
--                                 100 ms at 2,000 segments)
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE OR REPLACE FUNCTION {schema}.status_partitions(p_topic_ids integer[], p_from bigint[])
RETURNS TABLE (topic_id integer, "partition" integer, head bigint, events bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id   integer;
    v_from bigint;
    v_seg  regclass;
BEGIN
    FOR v_id, v_from, v_seg IN
        SELECT u.id, u.f, to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || u.id || '_s' || s.segment))
          FROM unnest(p_topic_ids, p_from) AS u(id, f)
          JOIN {schema}.segments s ON s.topic_id = u.id AND s.hi > u.f AND s.removing_at IS NULL
         ORDER BY u.id, s.segment
    LOOP
        IF v_seg IS NULL THEN
            CONTINUE;  -- removed since the caller read it
        END IF;
        RETURN QUERY EXECUTE format(
            'SELECT $1, e.partition, max(e.position), count(*) FROM %s e WHERE e.position >= $2'
            ' GROUP BY e.partition', v_seg)
          USING v_id, v_from;
    END LOOP;
END;
$$;

CREATE FUNCTION {schema}.status_sizes(p_topic_ids integer[])
RETURNS TABLE (topic_id integer, bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT u.id, coalesce(sum(
               pg_relation_size(c.oid)
               + CASE WHEN c.reltoastrelid <> 0 THEN pg_relation_size(c.reltoastrelid) ELSE 0 END
               + (SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0) FROM pg_index i
                   WHERE i.indrelid IN (c.oid, c.reltoastrelid))), 0)::bigint
      FROM unnest(p_topic_ids) AS u(id)
      LEFT JOIN pg_inherits h
             ON h.inhparent = to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || u.id))
      LEFT JOIN pg_class c ON c.oid = h.inhrelid
     GROUP BY u.id;
$$;
