-- The database-wide status (Client.status(), metrics, the web console) in a constant number of
-- statements, whatever the number of topics. Until now a status read sent one statement per topic for
-- its partitions and one per topic with checkpoints: at 1,000 topics a scrape took seconds, mostly in
-- the client and in per-statement overhead on the server.
--
--   status_marks()               per topic: the last position handed out, and whether a transaction
--                                holds a publisher registration of it (see 0004_partition_fence.sql)
--   status_partitions(ids, from) per partition of the given topics: the newest position and the events
--                                from a position on (the unsealed segments)
--   status_checkpoints(...)      per checkpoint on the given topics: the time of its first unread event
--                                and its unread events outside the sealed segments' statistics
--
-- status_marks() lets a reader keep the figures of a topic (its partitions, its size on disk, the unread
-- events after an unmoved checkpoint) from one read to the next: if the
-- sequence had not moved since a read that found no registered publisher (so every position up to it
-- had been drawn by a transaction that had ended), no event can have appeared since, as for a poll's
-- fences (0006_single_key_publish.sql, load_fences()). The sequence is read before the locks.
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE FUNCTION {schema}.status_marks()
RETURNS TABLE (topic_id integer, last_position bigint, publishing boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_ids  integer[];
    v_last bigint[];
    v_held integer[];
BEGIN
    -- (1) every topic's sequence
    SELECT array_agg(t.id ORDER BY t.id),
           array_agg(coalesce(pg_sequence_last_value(
               to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || t.id || '_seq'))), 0) ORDER BY t.id)
      INTO v_ids, v_last FROM {schema}.topics t;
    -- (2) then the topics some transaction is registered as a publisher of (partition, topic and single
    -- keys: 0004 and 0006)
    SELECT array_agg(DISTINCT CASE WHEN l.k >> 60 = 5 THEN (l.k >> 10) & 1125899906842623
                                   WHEN l.k >> 60 = 6 THEN (l.k >> 40) & 1048575
                                   ELSE (l.k >> 40) & 1023 END)
      INTO v_held
      FROM (SELECT (s.classid::bigint << 32) | s.objid::bigint AS k
              FROM pg_lock_status() s
             WHERE s.locktype = 'advisory' AND s.objsubid = 1
               AND s.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())) l
     WHERE l.k >> 60 IN (5, 6, 7);
    RETURN QUERY
        SELECT u.id, u.last, u.id = ANY (coalesce(v_held, '{{}}'::integer[]))
          FROM unnest(v_ids, v_last) AS u(id, last);
END;
$$;

-- Per partition of each topic of p_topic_ids holding events at or after the matching p_from (where its
-- sealed segments end): the newest such position and how many there are. One scan of the unsealed
-- segments of each topic (the one being filled); partitions without such events are left out.
CREATE FUNCTION {schema}.status_partitions(p_topic_ids integer[], p_from bigint[])
RETURNS TABLE (topic_id integer, "partition" integer, head bigint, events bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id   integer;
    v_from bigint;
BEGIN
    FOR v_id, v_from IN SELECT u.id, u.f FROM unnest(p_topic_ids, p_from) AS u(id, f) LOOP
        IF to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || v_id)) IS NULL THEN
            CONTINUE;  -- deleted since the caller read it
        END IF;
        RETURN QUERY EXECUTE format(
            'SELECT $1, e.partition, max(e.position), count(*) FROM %1$I.%2$I e'
            ' WHERE e.position >= $2 GROUP BY e.partition', '{schema_raw}', 'topic_' || v_id)
          USING v_id, v_from;
    END LOOP;
END;
$$;

-- Per checkpoint on each topic of p_topic_ids (with the matching p_from, where its sealed segments end,
-- and p_size, its segment size): the time of the first unread event (an index probe); the unread events
-- of the unsealed segments (tail) and of the sealed segment holding the checkpoint (in_segment): the
-- only rows counted, other sealed segments count from their statistics.
CREATE FUNCTION {schema}.status_checkpoints(p_topic_ids integer[], p_from bigint[], p_size bigint[])
RETURNS TABLE (group_name text, topic_id integer, "partition" integer, checkpoint bigint,
               first_unread_at timestamptz, tail bigint, in_segment bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id   integer;
    v_from bigint;
    v_size bigint;
BEGIN
    FOR v_id, v_from, v_size IN SELECT u.id, u.f, u.s FROM unnest(p_topic_ids, p_from, p_size) AS u(id, f, s)
    LOOP
        IF to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || v_id)) IS NULL THEN
            CONTINUE;
        END IF;
        RETURN QUERY EXECUTE format(
            'SELECT k.group_name, k.topic_id, k.partition, k.position,'
            '       (SELECT e.created_at FROM %1$I.%2$I e'
            '         WHERE (e.partition, e.position) > (k.partition, k.position)'
            '           AND (e.partition, e.position) < (k.partition + 1, 0)'
            '         ORDER BY e.partition, e.position LIMIT 1),'
            '       (SELECT count(*) FROM %1$I.%2$I e'
            '         WHERE (e.partition, e.position) > (k.partition, greatest(k.position, $2 - 1))'
            '           AND (e.partition, e.position) < (k.partition + 1, 0)),'
            '       (SELECT count(*) FROM %1$I.%2$I e'
            '         WHERE (e.partition, e.position) > (k.partition, k.position)'
            '           AND (e.partition, e.position) < (k.partition, least((k.position / $3 + 1) * $3, $2)))'
            '  FROM %1$I.checkpoints k WHERE k.topic_id = $1', '{schema_raw}', 'topic_' || v_id)
          USING v_id, v_from, v_size;
    END LOOP;
END;
$$;
