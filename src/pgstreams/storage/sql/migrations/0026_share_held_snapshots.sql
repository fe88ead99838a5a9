-- Held snapshots and share groups: the state rows of a share group are found without walking the versions
-- of those already done.
--
-- A share group inserts a batch row per acquisition and deletes it at the ack (0007_share_groups.sql). While
-- a snapshot holds the xmin horizon back, neither VACUUM nor page pruning may remove the deleted rows: every
-- index of share_events keeps an entry for each, and each entry costs a visit of the heap to learn that the
-- row is gone. The planner cannot see them (the table has a few live rows), so among the indexes that fit a
-- statement it may take one whose leading columns match only (group, topic[, partition]), or drive a join
-- from share_events: the statement then walks every row the group ever held. After 10 minutes of a held
-- snapshot an ack read thousands of index entries and heap pages (15 ms and more instead of 0.3).
--
-- The statements of the hot path now reach their rows in ways that do not depend on that choice:
--
-- * a row named by its key (ack of a batch, a batch exploded into its events) is looked up alone, by its
--   whole primary key, with no condition that would let a partial index serve it (a batch row is one with
--   a batch array: "batch IS NOT NULL" stands for "state = 'b'");
-- * the rows taken again (share_take_due()) are locked where they are found and then updated by their
--   ctid, not joined back to the table by key;
-- * the search for expired locks (batch rows and acquired events whose "until" has passed) reads only the
--   locks that expired in the last p_expired_window_ms milliseconds when that is given (the index of
--   locked rows, now led by "until": the entries of rows done long ago lie before the window), and all
--   of them otherwise. A consumer searches the window about once a second and everything every
--   pgstreams.shares.consumer.FULL_EXPIRY_SCAN seconds (and at its first acquisition), so a lock that expired
--   while no consumer searched is found by the next full search.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

-- Expired locks are found by time: "until" leads the index of locked rows (it led with the group, topic
-- and partition), and the searches write their conditions on those as one expression (... IS TRUE) that no
-- index can serve, so that the planner cannot walk the primary key's entries of the group instead.
CREATE INDEX share_events_expiry_idx ON {schema}.share_events (until) WHERE state IN ('a', 'b');
DROP INDEX {schema}.share_events_locked_idx;

CREATE OR REPLACE FUNCTION {schema}.share_explode(p_group text, p_topic_id integer, p_partitions integer[],
                                                  p_positions bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_batch bigint[];
    v_dels  integer;
    v_owner text;
    v_until timestamptz;
    v_at    timestamptz;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_positions), 0) LOOP
        DELETE FROM {schema}.share_events s
         WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = p_partitions[i]
           AND s.position = p_positions[i] AND s.batch IS NOT NULL
        RETURNING s.batch, s.deliveries, s.owner, s.until, s.acquired_at
             INTO v_batch, v_dels, v_owner, v_until, v_at;
        IF FOUND THEN
            INSERT INTO {schema}.share_events (group_name, topic_id, partition, position, state, deliveries,
                                               owner, until, acquired_at)
            SELECT p_group, p_topic_id, p_partitions[i], b.position, 'a', v_dels, v_owner, v_until, v_at
              FROM unnest(v_batch) AS b(position);
        END IF;
    END LOOP;
END;
$$;

-- As share_take_due() of 0007_share_groups.sql, with p_expired_window_ms: with p_expired, look for the
-- locks that expired in the last p_expired_window_ms milliseconds only (NULL or 0: all of them).
CREATE FUNCTION {schema}.share_take_due(
    p_group text, p_topic_id integer, p_partitions integer[], p_owner text, p_max integer, p_lock_ms bigint,
    p_max_deliveries integer, p_dead_letter boolean, p_ordered boolean, p_expired boolean,
    p_expired_window_ms bigint
) RETURNS TABLE (o_partition integer, o_position bigint, o_deliveries integer, o_state "char")
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_until  timestamptz := clock_timestamp() + p_lock_ms * interval '1 millisecond';
    v_floor  timestamptz := CASE WHEN coalesce(p_expired_window_ms, 0) > 0
                                 THEN clock_timestamp() - p_expired_window_ms * interval '1 millisecond'
                                 ELSE '-infinity' END;
    v_found  bigint[];
    v_parts  integer[];
    v_pos    bigint[];
    v_dels   integer[];
    v_states "char"[];
    v_at     tid[];
    r        record;
BEGIN
    PERFORM set_config('pgstreams.share_due', '0', false);
    IF p_expired THEN  -- batches whose lock expired: their events are taken one by one from now on
        SELECT array_agg(e.partition), array_agg(e.position) INTO v_parts, v_found
          FROM (SELECT s.partition, s.position FROM {schema}.share_events s
                 WHERE s.state IN ('a', 'b') AND s.until <= v_now AND s.until > v_floor
                   AND (s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = ANY (p_partitions)
                        AND s.batch IS NOT NULL) IS TRUE
                   FOR UPDATE SKIP LOCKED) e;
        IF v_found IS NOT NULL THEN
            PERFORM {schema}.share_explode(p_group, p_topic_id, v_parts, v_found);
        END IF;
    END IF;
    -- the candidates, locked where they are found (each kind up to p_max: those of the two not taken stay
    -- locked until the acquisition commits, in the same round trip): due again (released, delay over,
    -- dead-letter claims expired) and, with p_expired, acquired events whose lock expired (in the window)
    SELECT array_agg(c.at ORDER BY c.position) INTO v_at
      FROM (
        SELECT c.at, c.position FROM (
            SELECT w.at, w.position FROM (
                SELECT w.ctid AS at, w.position FROM {schema}.share_events w
                 WHERE w.group_name = p_group AND w.topic_id = p_topic_id AND w.partition = ANY (p_partitions)
                   AND w.state NOT IN ('a', 'b') AND w.until <= v_now
                   AND (NOT p_ordered OR w.key IS NULL OR NOT EXISTS (
                            SELECT 1 FROM {schema}.share_events o
                             WHERE o.group_name = p_group AND o.topic_id = p_topic_id
                               AND o.partition = w.partition AND o.key = w.key AND o.position < w.position))
                 ORDER BY w.position
                 LIMIT p_max
                   FOR UPDATE SKIP LOCKED) w
            UNION ALL
            SELECT x.at, x.position FROM (
                SELECT x.ctid AS at, x.position FROM {schema}.share_events x
                 WHERE p_expired AND x.state IN ('a', 'b') AND x.until <= v_now AND x.until > v_floor
                   AND (x.group_name = p_group AND x.topic_id = p_topic_id AND x.partition = ANY (p_partitions)
                        AND x.batch IS NULL) IS TRUE
                   AND (NOT p_ordered OR x.key IS NULL OR NOT EXISTS (
                            SELECT 1 FROM {schema}.share_events o
                             WHERE o.group_name = p_group AND o.topic_id = p_topic_id
                               AND o.partition = x.partition AND o.key = x.key AND o.position < x.position))
                 ORDER BY x.position
                 LIMIT p_max
                   FOR UPDATE SKIP LOCKED) x
        ) c
         ORDER BY c.position
         LIMIT p_max
      ) c;
    IF v_at IS NULL THEN
        RETURN;
    END IF;
    WITH upd AS (
        UPDATE {schema}.share_events s
           SET state = CASE WHEN s.state = 'd' OR s.deliveries >= p_max_deliveries THEN 'd' ELSE 'a' END,
               deliveries = CASE WHEN s.state = 'd' OR s.deliveries >= p_max_deliveries THEN s.deliveries
                                 ELSE s.deliveries + 1 END,
               owner = p_owner, until = v_until, acquired_at = v_now
         WHERE s.ctid = ANY (v_at)
           AND s.group_name = p_group AND s.topic_id = p_topic_id AND s.until <= v_now
        RETURNING s.partition, s.position, s.deliveries, s.state
    )
    SELECT array_agg(u.partition), array_agg(u.position), array_agg(u.deliveries), array_agg(u.state)
      INTO v_parts, v_pos, v_dels, v_states
      FROM upd u;
    IF v_pos IS NULL THEN
        RETURN;
    END IF;
    IF NOT p_dead_letter AND 'd' = ANY (v_states) THEN
        -- no dead-letter topic: events delivered too often are dropped
        FOR r IN
            SELECT c.partition, c.position FROM unnest(v_parts, v_pos, v_states) AS c(partition, position, state)
             WHERE c.state = 'd'
        LOOP
            DELETE FROM {schema}.share_events s
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = r.partition
               AND s.position = r.position;
            UPDATE {schema}.share_partitions SET too_often = too_often + 1
             WHERE group_name = p_group AND topic_id = p_topic_id AND partition = r.partition;
        END LOOP;
    END IF;
    PERFORM set_config('pgstreams.share_due', cardinality(v_pos)::text, false);
    RETURN QUERY
        SELECT c.partition, c.position, c.deliveries, c.state
          FROM unnest(v_parts, v_pos, v_dels, v_states) AS c(partition, position, deliveries, state)
         WHERE p_dead_letter OR c.state <> 'd';
END;
$$;

-- The previous signature: every expired lock.
CREATE OR REPLACE FUNCTION {schema}.share_take_due(
    p_group text, p_topic_id integer, p_partitions integer[], p_owner text, p_max integer, p_lock_ms bigint,
    p_max_deliveries integer, p_dead_letter boolean, p_ordered boolean, p_expired boolean
) RETURNS TABLE (o_partition integer, o_position bigint, o_deliveries integer, o_state "char")
LANGUAGE sql AS $$
    SELECT * FROM {schema}.share_take_due(p_group, p_topic_id, p_partitions, p_owner, p_max, p_lock_ms,
                                          p_max_deliveries, p_dead_letter, p_ordered, p_expired, NULL::bigint);
$$;

-- Ack whole batch rows (partition, first position, every position) held by p_owner with an unexpired
-- lock: each looked up alone by its key. Returns those deleted.
CREATE FUNCTION {schema}.share_ack_batch_rows(p_group text, p_topic_id integer, p_owner text,
                                              p_partitions integer[], p_firsts bigint[], p_batches text[])
RETURNS TABLE (o_partition integer, o_position bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_partitions), 0) LOOP
        DELETE FROM {schema}.share_events s
         WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = p_partitions[i]
           AND s.position = p_firsts[i] AND s.batch = p_batches[i]::bigint[] AND s.owner = p_owner
           AND s.until > v_now;
        IF FOUND THEN
            o_partition := p_partitions[i];
            o_position := p_firsts[i];
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.share_ack_batches_all(p_group text, p_topic_id integer, p_owner text,
                                                          p_partitions integer[], p_firsts bigint[],
                                                          p_batches text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    SELECT count(*) INTO v_n
      FROM {schema}.share_ack_batch_rows(p_group, p_topic_id, p_owner, p_partitions, p_firsts, p_batches);
    IF v_n <> coalesce(cardinality(p_partitions), 0) THEN
        RAISE EXCEPTION 'share group %: % of % acked batches were no longer held by %', p_group,
              coalesce(cardinality(p_partitions), 0) - v_n, coalesce(cardinality(p_partitions), 0), p_owner
              USING ERRCODE = 'PSA01';
    END IF;
    RETURN v_n;
END $$;
