-- Share groups: competing consumers per event (Kafka's share groups, a queue over the log).
--
-- The state of a share group grows with the events in flight, not with the log:
--
--   share_groups      one row per (group, topic): the settings its latest consumer set, counters
--   share_partitions  one row per (group, topic, partition): the acquisition frontier. Every event at or
--                     below it has been taken into the group's state once; an event at or below it
--                     without a share_events row is done (acked, rejected or dead-lettered).
--   share_events      the events taken but not done: acquired (locked by a consumer until a time),
--                     available again (released, lock expired, delayed, or waiting behind an earlier
--                     event of its key), or being dead-lettered, one row each; except that the events a
--                     consumer takes past the frontier in one go (without ordering by key) share one
--                     "batch" row (their positions in an array) until one of them is settled alone, its
--                     lock expires, or all are acked together (the common case: one row inserted and one
--                     deleted per poll, not one per event). Done events lose their row.
--
-- The frontier moves only over events below the partition's read fence (partition_fences(),
-- 0004_partition_fence.sql), so no committed event is ever passed over. It stops while a partition has
-- a window of rows not acquired (released, delayed, waiting for their key): the bounded window, like
-- Kafka's share-partition record locks. Acquired rows are bounded by what the consumers hold.
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE TABLE {schema}.share_groups (
    group_name      text        NOT NULL,
    topic_id        integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    queue           boolean     NOT NULL DEFAULT false,
    lock_timeout_ms bigint      NOT NULL,
    max_deliveries  integer     NOT NULL,
    dead_letter     text,
    ordering        text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic_id)
);

CREATE TABLE {schema}.share_partitions (
    group_name     text    NOT NULL,
    topic_id       integer NOT NULL,
    partition      integer NOT NULL,
    start_position bigint  NOT NULL,
    frontier       bigint  NOT NULL,
    -- events removed because they reached max_deliveries (to the dead-letter topic, or dropped without
    -- one), events rejected by consumers, copies published to the dead-letter topic
    too_often      bigint  NOT NULL DEFAULT 0,
    rejected       bigint  NOT NULL DEFAULT 0,
    dead_lettered  bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (group_name, topic_id, partition),
    FOREIGN KEY (group_name, topic_id) REFERENCES {schema}.share_groups (group_name, topic_id)
        ON DELETE CASCADE
);

-- state: 'a' acquired by owner until "until"; 'b' a batch acquired by owner until "until" (position is its
-- first event's, batch all its positions, sorted; deliveries 1); 'r' available from "until" on; 'd' claimed
-- by owner until "until" to be published to the dead-letter topic. key: only with ordering by key.
CREATE TABLE {schema}.share_events (
    group_name  text        NOT NULL,
    topic_id    integer     NOT NULL,
    partition   integer     NOT NULL,
    position    bigint      NOT NULL,
    state       "char"      NOT NULL,
    deliveries  integer     NOT NULL,
    owner       text,
    until       timestamptz NOT NULL,
    acquired_at timestamptz,
    key         text,
    batch       bigint[],
    PRIMARY KEY (group_name, topic_id, partition, position)
);
-- Rows due again are found by time. Two partial indexes: acked rows (deleted) leave dead entries behind
-- until VACUUM, and those are all in the index of acquired rows, which is searched for expired locks only
-- when asked (p_expired); rows released, waiting or being dead-lettered are few and searched every time.
CREATE INDEX share_events_waiting_idx ON {schema}.share_events (group_name, topic_id, partition, until)
    WHERE state NOT IN ('a', 'b');
CREATE INDEX share_events_locked_idx ON {schema}.share_events (group_name, topic_id, partition, until)
    WHERE state IN ('a', 'b');
-- ordering by key: the earliest row of a key
CREATE INDEX share_events_key_idx ON {schema}.share_events (group_name, topic_id, partition, key, position)
    WHERE key IS NOT NULL;

-- A reserved header holding a publish delay in seconds (Client.publish(delay=...)); share groups do not
-- acquire the event before created_at + delay.
CREATE FUNCTION {schema}.share_not_before(p_created_at timestamptz, p_headers jsonb) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_headers ->> 'pgstreams.delay' ~ '^[0-9]{{1,9}}(\.[0-9]{{1,6}})?$'
                THEN p_created_at + (p_headers ->> 'pgstreams.delay')::numeric * interval '1 second' END;
$$;

-- Turn batch rows into one row per event (same owner, lock and delivery count), so that their events can
-- be settled, expire or be taken one by one. p_positions: the batch rows' first positions.
CREATE FUNCTION {schema}.share_explode(p_group text, p_topic_id integer, p_partitions integer[],
                                       p_positions bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_parts integer[];
    v_pos   bigint[];
    v_dels  integer[];
    v_owner text[];
    v_until timestamptz[];
    v_at    timestamptz[];
BEGIN
    WITH gone AS (
        DELETE FROM {schema}.share_events s
         USING unnest(p_partitions, p_positions) AS c(partition, position)
         WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
           AND s.position = c.position AND s.state = 'b'
        RETURNING s.partition, s.batch, s.deliveries, s.owner, s.until, s.acquired_at
    ), each AS (
        SELECT g.partition, b.position, g.deliveries, g.owner, g.until, g.acquired_at
          FROM gone g CROSS JOIN LATERAL unnest(g.batch) AS b(position)
    )
    SELECT array_agg(e.partition), array_agg(e.position), array_agg(e.deliveries), array_agg(e.owner),
           array_agg(e.until), array_agg(e.acquired_at)
      INTO v_parts, v_pos, v_dels, v_owner, v_until, v_at
      FROM each e;
    IF v_pos IS NOT NULL THEN
        INSERT INTO {schema}.share_events (group_name, topic_id, partition, position, state, deliveries, owner,
                                           until, acquired_at)
        SELECT p_group, p_topic_id, c.partition, c.position, 'a', c.deliveries, c.owner, c.until, c.acquired_at
          FROM unnest(v_parts, v_pos, v_dels, v_owner, v_until, v_at)
               AS c(partition, position, deliveries, owner, until, acquired_at);
    END IF;
END;
$$;

-- Acquiring (pgstreams.storage.shares) sends three statements in one round trip: share_take_due() takes
-- events due again; load_fences() reads the read fences; the named query share_advance (per topic, plan
-- cached) takes new events past the frontiers below the fences, up to what share_take_due left.

-- Take up to p_max events of a share group due again for p_owner, each locked for p_lock_ms: released,
-- delay over, claims for the dead-letter topic expired, and with p_expired those whose lock expired
-- (batch rows first become one row per event), oldest first. An event delivered p_max_deliveries times
-- already is not delivered: it is claimed for the dead-letter topic (state 'd', returned, with
-- p_dead_letter) or, without one, dropped. With p_ordered, an event with a key is taken only when no
-- earlier event of that key is in the group's state. Leaves how many it returned in the session setting
-- pgstreams.share_due (for share_advance).
CREATE FUNCTION {schema}.share_take_due(
    p_group text, p_topic_id integer, p_partitions integer[], p_owner text, p_max integer, p_lock_ms bigint,
    p_max_deliveries integer, p_dead_letter boolean, p_ordered boolean, p_expired boolean
) RETURNS TABLE (o_partition integer, o_position bigint, o_deliveries integer, o_state "char")
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_until  timestamptz := clock_timestamp() + p_lock_ms * interval '1 millisecond';
    v_parts  integer[];
    v_pos    bigint[];
    v_dels   integer[];
    v_states "char"[];
    r        record;
BEGIN
    PERFORM set_config('pgstreams.share_due', '0', false);
    IF p_expired THEN  -- batches whose lock expired: their events are taken one by one from now on
        PERFORM {schema}.share_explode(p_group, p_topic_id, array_agg(e.partition), array_agg(e.position))
           FROM (SELECT s.partition, s.position FROM {schema}.share_events s
                  WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = ANY (p_partitions)
                    AND s.state = 'b' AND s.until <= v_now
                    FOR UPDATE SKIP LOCKED) e
         HAVING count(*) > 0;
    END IF;
    WITH cand AS (
        SELECT s.partition, s.position FROM (
            SELECT w.partition, w.position FROM {schema}.share_events w
             WHERE w.group_name = p_group AND w.topic_id = p_topic_id AND w.partition = ANY (p_partitions)
               AND w.state NOT IN ('a', 'b') AND w.until <= v_now
            UNION ALL
            SELECT x.partition, x.position FROM {schema}.share_events x
             WHERE p_expired AND x.group_name = p_group AND x.topic_id = p_topic_id
               AND x.partition = ANY (p_partitions) AND x.state = 'a' AND x.until <= v_now
        ) c
          JOIN {schema}.share_events s
            ON s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
           AND s.position = c.position
         WHERE s.until <= v_now
           AND (NOT p_ordered OR s.key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM {schema}.share_events o
                     WHERE o.group_name = p_group AND o.topic_id = p_topic_id AND o.partition = s.partition
                       AND o.key = s.key AND o.position < s.position))
         ORDER BY s.position
         LIMIT p_max
           FOR UPDATE OF s SKIP LOCKED
    ), upd AS (
        UPDATE {schema}.share_events s
           SET state = CASE WHEN s.state = 'd' OR s.deliveries >= p_max_deliveries THEN 'd' ELSE 'a' END,
               deliveries = CASE WHEN s.state = 'd' OR s.deliveries >= p_max_deliveries THEN s.deliveries
                                 ELSE s.deliveries + 1 END,
               owner = p_owner, until = v_until, acquired_at = v_now
          FROM cand
         WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = cand.partition
           AND s.position = cand.position
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
            WITH gone AS (
                DELETE FROM {schema}.share_events s
                 USING unnest(v_parts, v_pos, v_states) AS c(partition, position, state)
                 WHERE c.state = 'd' AND s.group_name = p_group AND s.topic_id = p_topic_id
                   AND s.partition = c.partition AND s.position = c.position
                RETURNING s.partition
            )
            SELECT g.partition, count(*) AS n FROM gone g GROUP BY g.partition
        LOOP
            UPDATE {schema}.share_partitions SET too_often = too_often + r.n
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

-- Settle events a consumer acquired (each given with the delivery count it was acquired with):
-- p_action 'k' ack (done), 'l' release (available again after p_delay_ms), 'n' renew (locked p_lock_ms
-- more), 'j' reject (done; the caller publishes dead-letter copies of those returned 'k' in the same
-- transaction), 'x' finish a dead-letter claim (done; the caller publishes the copies likewise).
-- Only an acquisition still held takes effect: same owner, same delivery count, lock not expired
-- (claims of 'x' may have expired: nobody else took them). Returns per event 'k' (done), 'e' (its lock
-- expired: nothing done, it is delivered again), 'o' (another acquisition holds it or it is done: nothing
-- done) or, for a release of an event delivered p_max_deliveries times, 'd' (claimed for the dead-letter
-- topic with p_dead_letter; else dropped).
CREATE FUNCTION {schema}.share_settle(
    p_group text, p_topic_id integer, p_owner text, p_partitions integer[], p_positions bigint[],
    p_deliveries integer[], p_batches bigint[], p_action "char", p_delay_ms bigint, p_lock_ms bigint,
    p_max_deliveries integer, p_dead_letter boolean
) RETURNS TABLE (o_partition integer, o_position bigint, o_outcome "char")
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_parts integer[];
    v_pos   bigint[];
    v_outs  "char"[];
    v_bp    integer[];
    v_bpos  bigint[];
    r       record;
BEGIN
    IF p_action = 'k' THEN
        -- batches acked whole and still held: one row deleted for all their events
        WITH req AS (
            SELECT c.partition, c.batch, array_agg(c.position ORDER BY c.position) AS ps
              FROM unnest(p_partitions, p_positions, p_batches) AS c(partition, position, batch)
             WHERE c.batch IS NOT NULL
             GROUP BY c.partition, c.batch
        ), done AS (
            DELETE FROM {schema}.share_events s USING req
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = req.partition
               AND s.position = req.batch AND s.state = 'b' AND s.owner = p_owner AND s.until > v_now
               AND s.batch = req.ps
            RETURNING s.partition, s.batch
        )
        SELECT array_agg(d.partition), array_agg(b.position), array_agg('k'::"char")
          INTO v_parts, v_pos, v_outs
          FROM done d CROSS JOIN LATERAL unnest(d.batch) AS b(position);
    END IF;
    IF cardinality(v_pos) = cardinality(p_positions) THEN  -- all acked with their batches
        RETURN QUERY SELECT c.partition, c.position, 'k'::"char"
                       FROM unnest(p_partitions, p_positions) AS c(partition, position);
        RETURN;
    END IF;
    -- the other batches named (held by this owner): one row per event from now on
    SELECT array_agg(c.partition), array_agg(c.batch) INTO v_bp, v_bpos
      FROM (SELECT DISTINCT c.partition, c.batch
              FROM unnest(p_partitions, p_batches) AS c(partition, batch) WHERE c.batch IS NOT NULL) c
      JOIN {schema}.share_events s
        ON s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
       AND s.position = c.batch AND s.state = 'b' AND s.owner = p_owner;
    IF v_bpos IS NOT NULL THEN
        PERFORM {schema}.share_explode(p_group, p_topic_id, v_bp, v_bpos);
    END IF;
    IF p_action IN ('k', 'j') THEN
        WITH done AS (
            DELETE FROM {schema}.share_events s
             USING unnest(p_partitions, p_positions, p_deliveries) AS c(partition, position, deliveries)
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
               AND s.position = c.position AND s.owner = p_owner AND s.deliveries = c.deliveries
               AND s.state = 'a' AND s.until > v_now
            RETURNING s.partition, s.position
        )
        SELECT coalesce(v_parts, '{{}}') || coalesce(array_agg(d.partition), '{{}}'),
               coalesce(v_pos, '{{}}') || coalesce(array_agg(d.position), '{{}}'),
               coalesce(v_outs, '{{}}') || coalesce(array_agg('k'::"char"), '{{}}')
          INTO v_parts, v_pos, v_outs FROM done d;
    ELSIF p_action = 'x' THEN
        WITH done AS (
            DELETE FROM {schema}.share_events s
             USING unnest(p_partitions, p_positions, p_deliveries) AS c(partition, position, deliveries)
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
               AND s.position = c.position AND s.owner = p_owner AND s.deliveries = c.deliveries
               AND s.state = 'd'
            RETURNING s.partition, s.position
        )
        SELECT array_agg(d.partition), array_agg(d.position), array_agg('k'::"char")
          INTO v_parts, v_pos, v_outs FROM done d;
    ELSIF p_action = 'n' THEN
        WITH done AS (
            UPDATE {schema}.share_events s SET until = v_now + p_lock_ms * interval '1 millisecond'
              FROM unnest(p_partitions, p_positions, p_deliveries) AS c(partition, position, deliveries)
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
               AND s.position = c.position AND s.owner = p_owner AND s.deliveries = c.deliveries
               AND s.state = 'a' AND s.until > v_now
            RETURNING s.partition, s.position
        )
        SELECT array_agg(d.partition), array_agg(d.position), array_agg('k'::"char")
          INTO v_parts, v_pos, v_outs FROM done d;
    ELSIF p_action = 'l' THEN
        WITH done AS (
            UPDATE {schema}.share_events s
               SET state = CASE WHEN s.deliveries >= p_max_deliveries THEN 'd' ELSE 'r' END,
                   owner = CASE WHEN s.deliveries >= p_max_deliveries THEN p_owner END,
                   until = CASE WHEN s.deliveries >= p_max_deliveries
                                THEN v_now + p_lock_ms * interval '1 millisecond'
                                ELSE v_now + p_delay_ms * interval '1 millisecond' END
              FROM unnest(p_partitions, p_positions, p_deliveries) AS c(partition, position, deliveries)
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
               AND s.position = c.position AND s.owner = p_owner AND s.deliveries = c.deliveries
               AND s.state = 'a' AND s.until > v_now
            RETURNING s.partition, s.position, s.state
        )
        SELECT array_agg(d.partition), array_agg(d.position), array_agg(CASE WHEN d.state = 'd' THEN 'd' ELSE 'k' END::"char")
          INTO v_parts, v_pos, v_outs FROM done d;
        IF NOT p_dead_letter AND 'd' = ANY (v_outs) THEN
            -- no dead-letter topic: events delivered too often are dropped
            FOR r IN
                WITH gone AS (
                    DELETE FROM {schema}.share_events s
                     USING unnest(v_parts, v_pos, v_outs) AS c(partition, position, outcome)
                     WHERE c.outcome = 'd' AND s.group_name = p_group AND s.topic_id = p_topic_id
                       AND s.partition = c.partition AND s.position = c.position
                    RETURNING s.partition
                )
                SELECT g.partition, count(*) AS n FROM gone g GROUP BY g.partition
            LOOP
                UPDATE {schema}.share_partitions SET too_often = too_often + r.n
                 WHERE group_name = p_group AND topic_id = p_topic_id AND partition = r.partition;
            END LOOP;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown share action %', p_action USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT c.partition, c.position,
               coalesce(d.outcome,
                        CASE WHEN EXISTS (SELECT 1 FROM {schema}.share_events s
                                           WHERE s.group_name = p_group AND s.topic_id = p_topic_id
                                             AND s.partition = c.partition AND s.position = c.position
                                             AND s.owner = p_owner AND s.deliveries = c.deliveries
                                             AND s.state = 'a')
                             THEN 'e'::"char" ELSE 'o'::"char" END)
          FROM unnest(p_partitions, p_positions, p_deliveries) AS c(partition, position, deliveries)
          LEFT JOIN unnest(v_parts, v_pos, v_outs) AS d(partition, position, outcome)
                 ON d.partition = c.partition AND d.position = c.position;
END;
$$;

-- Count events removed from a share group's state on a partition: p_too_often delivered too often,
-- p_rejected rejected, p_dead_lettered copies published to the dead-letter topic.
CREATE FUNCTION {schema}.share_count(
    p_group text, p_topic_id integer, p_partition integer, p_too_often integer, p_rejected integer,
    p_dead_lettered integer
) RETURNS void
LANGUAGE sql AS $$
    UPDATE {schema}.share_partitions
       SET too_often = too_often + p_too_often, rejected = rejected + p_rejected,
           dead_lettered = dead_lettered + p_dead_lettered
     WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition;
$$;

-- Per share group, topic and partition: where the group started, its frontier, the partition's head,
-- events acquired now, events available (due again, or past the frontier: lag), events waiting for a
-- delay or a key, events delivered max_deliveries times that are not yet dead-lettered, the oldest lock
-- held, and the counters.
CREATE VIEW {schema}.share_group_status AS
SELECT g.group_name, t.name AS topic, sp.topic_id, sp.partition, g.queue,
       NULLIF(sp.start_position, 0) AS start, sp.frontier, pe.head,
       coalesce(st.acquired, 0) AS acquired,
       coalesce(st.due, 0) + greatest(coalesce(pe.lag, 0), 0) AS available,
       coalesce(st.waiting, 0) AS waiting,
       coalesce(st.too_often, 0) AS delivered_too_often,
       st.oldest_lock,
       sp.too_often AS removed_too_often, sp.rejected, sp.dead_lettered,
       g.dead_letter, g.max_deliveries, g.lock_timeout_ms / 1000.0 AS lock_timeout, g.ordering
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
