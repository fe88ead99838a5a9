-- The status read when every topic changed since the last read: the segments ahead of the publishers.
--
-- The client keeps at least one empty segment ahead of the highest position (so that no publish pays a
-- CREATE TABLE). status_partitions() and status_sizes() read every segment not sealed yet, those empty
-- ones too: at 1,000 topics of 2 such segments each, half of the 2,000 statements of status_partitions()
-- and half of the relations whose size status_sizes() looks up were segments that cannot hold an event
-- (about 100 us per segment and statement, most of it opening the relation).
--
-- Their overloads below take each topic's last position handed out (status_marks(), read in the same
-- status read just before) and leave out the segments starting after it: no event can be there (a
-- position is drawn from the topic's sequence before its row is inserted). Events published after that
-- mark into a segment left out are counted by the next status read (the mark moved: the topic is read
-- again). The bytes of a topic are those of the segments up to its last position: an empty segment
-- ahead, a few pages of index, is not counted.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE FUNCTION {schema}.status_partitions(p_topic_ids integer[], p_from bigint[], p_last bigint[])
RETURNS TABLE (topic_id integer, "partition" integer, head bigint, events bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id   integer;
    v_from bigint;
    v_seg  regclass;
BEGIN
    FOR v_id, v_from, v_seg IN
        SELECT u.id, u.f, to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || u.id || '_s' || s.segment))
          FROM unnest(p_topic_ids, p_from, p_last) AS u(id, f, l)
          JOIN {schema}.segments s
            ON s.topic_id = u.id AND s.hi > u.f AND s.lo <= u.l AND s.removing_at IS NULL
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

CREATE FUNCTION {schema}.status_sizes(p_topic_ids integer[], p_last bigint[])
RETURNS TABLE (topic_id integer, bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT u.id, coalesce(sum(
               pg_relation_size(c.oid)
               + CASE WHEN c.reltoastrelid <> 0 THEN pg_relation_size(c.reltoastrelid) ELSE 0 END
               + (SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0) FROM pg_index i
                   WHERE i.indrelid IN (c.oid, c.reltoastrelid))), 0)::bigint
      FROM unnest(p_topic_ids, p_last) AS u(id, l)
      LEFT JOIN {schema}.segments s ON s.topic_id = u.id AND s.lo <= u.l AND s.removing_at IS NULL
      LEFT JOIN pg_class c
             ON c.oid = to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || u.id || '_s' || s.segment))
     GROUP BY u.id;
$$;
