-- Share groups behind retention. Retention does not wait for groups (operations.md): a share group, like a
-- stream group, loses the events retention removes before it settled them, and the loss is counted.
--
--   share_partitions.lost  events of the partition the group lost to retention: events past its frontier
--                          in segments marked for removal (counted, and the frontier moved past them, when
--                          the segments are marked: share_retention_loss(), called by mark_removing()), and
--                          events of its state found removed when they were due again (counted by the
--                          consumer that finds them: the named query share_forget). Events acquired when
--                          their segment goes keep their row: the consumer holding them still acks them.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.share_partitions ADD COLUMN lost bigint NOT NULL DEFAULT 0;

-- Count, for every share group of a topic, the events it loses when p_segments are removed: events past its
-- frontier in those segments (exact: from the segments' statistics, and row by row in the segment holding
-- the frontier) and rows of its state in them that no consumer holds (released, delayed, waiting for their
-- key); move the frontier past them and delete those rows. Runs in the transaction marking the segments
-- (before they are detached, so the segment holding a frontier can still be counted); the frontier rows are
-- locked first, so an acquisition advancing one finishes before (or waits). Returns the events lost.
CREATE FUNCTION {schema}.share_retention_loss(p_topic_id integer, p_segments bigint[]) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_total bigint := 0;
    v_n     bigint;
    v_row   bigint;
    r       record;
BEGIN
    PERFORM 1 FROM {schema}.share_partitions sp WHERE sp.topic_id = p_topic_id
      ORDER BY sp.group_name, sp.partition FOR UPDATE;
    FOR r IN SELECT sp.group_name, sp.partition, sp.frontier,
                    max(x.last_position) AS last,
                    coalesce(sum(x.events) FILTER (WHERE x.first_position > sp.frontier), 0) AS whole,
                    max(x.segment) FILTER (WHERE x.first_position <= sp.frontier
                                             AND x.last_position > sp.frontier) AS cut
               FROM {schema}.share_partitions sp
               JOIN {schema}.segment_partitions x
                 ON x.topic_id = sp.topic_id AND x.partition = sp.partition AND x.segment = ANY (p_segments)
              WHERE sp.topic_id = p_topic_id
              GROUP BY sp.group_name, sp.partition, sp.frontier
    LOOP
        v_n := r.whole;
        IF r.cut IS NOT NULL THEN
            EXECUTE format('SELECT count(*) FROM %I.%I WHERE partition = $1 AND position > $2',
                           '{schema_raw}', 'topic_' || p_topic_id || '_s' || r.cut)
               INTO v_row USING r.partition, r.frontier;
            v_n := v_n + v_row;
        END IF;
        WITH gone AS (
            DELETE FROM {schema}.share_events s
             WHERE s.group_name = r.group_name AND s.topic_id = p_topic_id AND s.partition = r.partition
               AND s.position <= r.last AND s.state = 'r'
            RETURNING 1
        )
        SELECT v_n + count(*) INTO v_n FROM gone;
        IF v_n > 0 OR r.frontier < r.last THEN
            UPDATE {schema}.share_partitions
               SET frontier = greatest(frontier, r.last), lost = lost + v_n
             WHERE group_name = r.group_name AND topic_id = p_topic_id AND partition = r.partition;
        END IF;
        v_total := v_total + v_n;
    END LOOP;
    RETURN v_total;
END;
$$;

-- mark_removing() (0008_operations.sql) now also counts what share groups lose, and returns it.
DROP FUNCTION {schema}.mark_removing(integer, bigint[], bigint, bigint);
CREATE FUNCTION {schema}.mark_removing(p_topic_id integer, p_segments bigint[], p_events bigint, p_bytes bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.segments SET removing_at = now()
     WHERE topic_id = p_topic_id AND segment = ANY(p_segments) AND removing_at IS NULL;
    UPDATE {schema}.segment_partitions SET removed_at = now()
     WHERE topic_id = p_topic_id AND segment = ANY(p_segments) AND removed_at IS NULL;
    INSERT INTO {schema}.topic_retention AS t (topic_id, ran_at, segments_removed, events_removed, bytes_removed)
    VALUES (p_topic_id, now(), cardinality(p_segments), p_events, p_bytes)
    ON CONFLICT (topic_id) DO UPDATE
       SET ran_at = now(), segments_removed = t.segments_removed + excluded.segments_removed,
           events_removed = t.events_removed + excluded.events_removed,
           bytes_removed = t.bytes_removed + excluded.bytes_removed;
    RETURN {schema}.share_retention_loss(p_topic_id, p_segments);
END;
$$;

-- share_group_status (0007_share_groups.sql) with the events lost to retention at the end.
CREATE OR REPLACE VIEW {schema}.share_group_status AS
SELECT g.group_name, t.name AS topic, sp.topic_id, sp.partition, g.queue,
       NULLIF(sp.start_position, 0) AS start, sp.frontier, pe.head,
       coalesce(st.acquired, 0) AS acquired,
       coalesce(st.due, 0) + greatest(coalesce(pe.lag, 0), 0) AS available,
       coalesce(st.waiting, 0) AS waiting,
       coalesce(st.too_often, 0) AS delivered_too_often,
       st.oldest_lock,
       sp.too_often AS removed_too_often, sp.rejected, sp.dead_lettered,
       g.dead_letter, g.max_deliveries, g.lock_timeout_ms / 1000.0 AS lock_timeout, g.ordering,
       sp.lost
  FROM {schema}.share_partitions sp
  JOIN {schema}.share_groups g ON g.group_name = sp.group_name AND g.topic_id = sp.topic_id
  JOIN {schema}.topics t ON t.id = sp.topic_id
 CROSS JOIN LATERAL {schema}.partition_progress(sp.topic_id, sp.partition, sp.frontier) pe
  LEFT JOIN LATERAL (
      SELECT sum(coalesce(cardinality(s.batch), 1)) FILTER (WHERE s.state IN ('a', 'b', 'd') AND s.until > now())
                 AS acquired,
             sum(coalesce(cardinality(s.batch), 1)) FILTER (WHERE s.until <= now()) AS due,
             count(*) FILTER (WHERE s.state = 'r' AND s.until > now()) AS waiting,
             sum(coalesce(cardinality(s.batch), 1)) FILTER (
                 WHERE s.deliveries >= g.max_deliveries AND NOT (s.state IN ('a', 'b') AND s.until > now()))
                 AS too_often,
             min(s.acquired_at) FILTER (WHERE s.state IN ('a', 'b', 'd') AND s.until > now()) AS oldest_lock
        FROM {schema}.share_events s
       WHERE s.group_name = sp.group_name AND s.topic_id = sp.topic_id AND s.partition = sp.partition
  ) st ON true;

-- A transaction's acks (ShareConsumer.transaction()) ride on its COMMIT: the acking statement and the COMMIT
-- go in one round trip, and the statement ends with share_expect(acked, wanted), which raises (SQLSTATE
-- PSA01) unless every event was acked, so the COMMIT then rolls back the handler's writes with the acks.
CREATE FUNCTION {schema}.share_expect(p_done bigint, p_want bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF p_done IS DISTINCT FROM p_want THEN
        RAISE EXCEPTION 'share group acks: % of % events acked (locks expired or taken over)',
            coalesce(p_done, 0), p_want USING ERRCODE = 'PSA01';
    END IF;
    RETURN p_done;
END;
$$;
