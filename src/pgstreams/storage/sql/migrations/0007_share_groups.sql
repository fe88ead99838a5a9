-- Share groups: competing consumers per event (Kafka's share groups, a queue over the log).
--
-- The state of a share group grows with the events in flight, not with the log:
--
--   share_groups      one row per (group, topic): the settings its latest consumer set, counters
--   share_partitions  one row per (group, topic, partition): the acquisition frontier. Every event at or
--                     below it has been taken into the group's state once; an event at or below it
--                     without a share_events row is done (acked, rejected or dead-lettered).
--   share_events      one row per event taken but not done: acquired (locked by a consumer until a
--                     time), available again (released, lock expired, delayed, or waiting behind an
--                     earlier event of its key), or being dead-lettered. Done events lose their row.
--
-- The frontier moves only over events below the partition's read fence (partition_fences(),
-- 0004_partition_fence.sql), so no committed event is ever passed over. It stops while a partition has
-- p_window rows (the bounded window of events in flight, like Kafka's share-partition record locks).
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

-- state: 'a' acquired by owner until "until"; 'r' available from "until" on; 'd' claimed by owner until
-- "until" to be published to the dead-letter topic. key: only with ordering by key.
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
    PRIMARY KEY (group_name, topic_id, partition, position)
);
-- rows due (lock expired, released, delay over) are found by time, not by scanning those in flight
CREATE INDEX share_events_due_idx ON {schema}.share_events (group_name, topic_id, partition, until);
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

-- Acquire up to p_max events of a share group for p_owner, each locked for p_lock_ms: first events due
-- again (lock expired, released, delay over), oldest first, then new events past each partition's
-- frontier (partitions in the order given: callers rotate it), below the read fence. An event due again
-- that was delivered p_max_deliveries times already is not delivered: it is claimed for the dead-letter
-- topic (state 'd', returned with p_dead_letter) or, without one, dropped. With p_ordered, an event with a
-- key is acquired only when no earlier event of that key is in the group's state (in flight, or waiting).
-- Returns the rows acquired ('a') or claimed ('d') with their events, in partition and position order.
CREATE FUNCTION {schema}.share_acquire(
    p_group text, p_topic_id integer, p_partitions integer[], p_owner text, p_max integer, p_lock_ms bigint,
    p_max_deliveries integer, p_dead_letter boolean, p_ordered boolean, p_window integer
) RETURNS TABLE (
    o_partition integer, o_position bigint, o_xid bigint, o_since_epoch interval, o_kind "char", o_key text,
    o_value bytea, o_headers jsonb, o_event_type text, o_event_id text, o_correlation_id text,
    o_causation_id text, o_deliveries integer, o_state "char"
)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_until   timestamptz := clock_timestamp() + p_lock_ms * interval '1 millisecond';
    v_table   text := format('%I.%I', '{schema_raw}', 'topic_' || p_topic_id);
    v_seq     regclass := format('%I.%I', '{schema_raw}', 'topic_' || p_topic_id || '_seq')::regclass;
    v_parts   integer[] := '{{}}';
    v_pos     bigint[] := '{{}}';
    v_dels    integer[] := '{{}}';
    v_states  "char"[] := '{{}}';
    v_fences  bigint[];
    v_got     integer;
    v_i       integer;
    v_p       integer;
    v_front   bigint;
    v_low     bigint;
    v_rows    integer;
    v_dropped integer;
    r         record;
BEGIN
    IF p_max < 1 THEN
        RETURN;
    END IF;
    -- (1) events due again
    FOR r IN
        WITH cand AS (
            SELECT s.partition, s.position FROM {schema}.share_events s
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = ANY (p_partitions)
               AND s.until <= v_now
               AND (NOT p_ordered OR s.key IS NULL OR NOT EXISTS (
                        SELECT 1 FROM {schema}.share_events o
                         WHERE o.group_name = p_group AND o.topic_id = p_topic_id AND o.partition = s.partition
                           AND o.key = s.key AND o.position < s.position))
             ORDER BY s.position
             LIMIT p_max
               FOR UPDATE SKIP LOCKED
        )
        UPDATE {schema}.share_events s
           SET state = CASE WHEN s.state = 'd' OR s.deliveries >= p_max_deliveries THEN 'd' ELSE 'a' END,
               deliveries = CASE WHEN s.state = 'd' OR s.deliveries >= p_max_deliveries THEN s.deliveries
                                 ELSE s.deliveries + 1 END,
               owner = p_owner, until = v_until, acquired_at = v_now
          FROM cand
         WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = cand.partition
           AND s.position = cand.position
        RETURNING s.partition, s.position, s.deliveries, s.state
    LOOP
        v_parts := v_parts || r.partition;
        v_pos := v_pos || r.position;
        v_dels := v_dels || r.deliveries;
        v_states := v_states || r.state;
    END LOOP;
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
        SELECT array_agg(c.partition ORDER BY c.i), array_agg(c.position ORDER BY c.i),
               array_agg(c.deliveries ORDER BY c.i), array_agg(c.state ORDER BY c.i)
          INTO v_parts, v_pos, v_dels, v_states
          FROM unnest(v_parts, v_pos, v_dels, v_states) WITH ORDINALITY AS c(partition, position, deliveries, state, i)
         WHERE c.state <> 'd';
        v_parts := coalesce(v_parts, '{{}}');
        v_pos := coalesce(v_pos, '{{}}');
        v_dels := coalesce(v_dels, '{{}}');
        v_states := coalesce(v_states, '{{}}');
    END IF;
    v_got := cardinality(v_pos);
    -- (2) new events past the frontiers, below the read fences (read in later statements)
    IF v_got < p_max THEN
        v_fences := {schema}.partition_fences(p_topic_id, p_partitions, v_seq);
        FOR v_i IN 1 .. cardinality(p_partitions) LOOP
            EXIT WHEN v_got >= p_max;
            v_p := p_partitions[v_i];
            -- the first partition (nothing is locked yet): wait for a competing consumer to finish
            -- its advance (consumers of one partition take turns); the others: skip busy ones
            IF v_i = 1 THEN
                SELECT sp.frontier INTO v_front FROM {schema}.share_partitions sp
                 WHERE sp.group_name = p_group AND sp.topic_id = p_topic_id AND sp.partition = v_p
                   FOR UPDATE;
            ELSE
                SELECT sp.frontier INTO v_front FROM {schema}.share_partitions sp
                 WHERE sp.group_name = p_group AND sp.topic_id = p_topic_id AND sp.partition = v_p
                   FOR UPDATE SKIP LOCKED;
            END IF;
            CONTINUE WHEN NOT FOUND OR v_front >= v_fences[v_i] - 1;
            -- the window: positions are topic-wide, so a span below p_window holds fewer rows
            SELECT s.position INTO v_low FROM {schema}.share_events s
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = v_p
             ORDER BY s.position LIMIT 1;
            IF v_low IS NOT NULL AND v_front - v_low >= p_window THEN
                SELECT count(*) INTO v_rows FROM (
                    SELECT 1 FROM {schema}.share_events s
                     WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = v_p
                     LIMIT p_window) w;
                CONTINUE WHEN v_rows >= p_window;
            END IF;
            FOR r IN EXECUTE format($q$
                WITH ev AS (
                    SELECT e.position, e.key, {schema}.share_not_before(e.created_at, e.headers) AS nb
                      FROM %s e
                     WHERE e.partition = $1 AND (e.partition, e.position) > ($1, $2) AND e.position < $3
                     ORDER BY e.position
                     LIMIT $4
                ), cls AS (
                    SELECT ev.position, ev.key, ev.nb,
                           (ev.nb IS NULL OR ev.nb <= $5)
                           AND (NOT $6 OR ev.key IS NULL
                                OR (row_number() OVER (PARTITION BY ev.key ORDER BY ev.position) = 1
                                    AND NOT EXISTS (
                                        SELECT 1 FROM {schema}.share_events o
                                         WHERE o.group_name = $7 AND o.topic_id = $8 AND o.partition = $1
                                           AND o.key = ev.key))) AS take
                      FROM ev
                ), ins AS (
                    INSERT INTO {schema}.share_events
                           (group_name, topic_id, partition, position, state, deliveries, owner, until,
                            acquired_at, key)
                    SELECT $7, $8, $1, c.position, CASE WHEN c.take THEN 'a' ELSE 'r' END,
                           CASE WHEN c.take THEN 1 ELSE 0 END, CASE WHEN c.take THEN $9 END,
                           CASE WHEN c.take THEN $10 ELSE coalesce(c.nb, '-infinity') END,
                           CASE WHEN c.take THEN $5 END, CASE WHEN $6 THEN c.key END
                      FROM cls c
                    RETURNING position, state
                )
                SELECT (SELECT max(position) FROM ev) AS top,
                       array_agg(ins.position ORDER BY ins.position) FILTER (WHERE ins.state = 'a') AS taken
                  FROM ins$q$, v_table)
                USING v_p, v_front, v_fences[v_i], p_max - v_got, v_now, p_ordered, p_group, p_topic_id,
                      p_owner, v_until
            LOOP
                IF r.top IS NOT NULL THEN
                    UPDATE {schema}.share_partitions SET frontier = r.top
                     WHERE group_name = p_group AND topic_id = p_topic_id AND partition = v_p;
                END IF;
                IF r.taken IS NOT NULL THEN
                    v_parts := v_parts || array_fill(v_p, ARRAY[cardinality(r.taken)]);
                    v_pos := v_pos || r.taken;
                    v_dels := v_dels || array_fill(1, ARRAY[cardinality(r.taken)]);
                    v_states := v_states || array_fill('a'::"char", ARRAY[cardinality(r.taken)]);
                    v_got := v_got + cardinality(r.taken);
                END IF;
            END LOOP;
        END LOOP;
    END IF;
    IF cardinality(v_pos) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format($q$
        SELECT e.partition, e.position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
               e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id,
               c.deliveries, c.state
          FROM unnest($1::integer[], $2::bigint[], $3::integer[], $4::"char"[]) AS c(partition, position, deliveries, state)
          JOIN %s e ON e.partition = c.partition AND e.position = c.position
         ORDER BY e.partition, e.position$q$, v_table)
        USING v_parts, v_pos, v_dels, v_states;
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
    p_deliveries integer[], p_action "char", p_delay_ms bigint, p_lock_ms bigint, p_max_deliveries integer,
    p_dead_letter boolean
) RETURNS TABLE (o_partition integer, o_position bigint, o_outcome "char")
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_parts integer[];
    v_pos   bigint[];
    v_outs  "char"[];
    r       record;
BEGIN
    IF p_action IN ('k', 'j') THEN
        WITH done AS (
            DELETE FROM {schema}.share_events s
             USING unnest(p_partitions, p_positions, p_deliveries) AS c(partition, position, deliveries)
             WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
               AND s.position = c.position AND s.owner = p_owner AND s.deliveries = c.deliveries
               AND s.state = 'a' AND s.until > v_now
            RETURNING s.partition, s.position
        )
        SELECT array_agg(d.partition), array_agg(d.position), array_agg('k'::"char")
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
      SELECT count(*) FILTER (WHERE s.state IN ('a', 'd') AND s.until > now()) AS acquired,
             count(*) FILTER (WHERE s.until <= now()) AS due,
             count(*) FILTER (WHERE s.state = 'r' AND s.until > now()) AS waiting,
             count(*) FILTER (WHERE s.deliveries >= g.max_deliveries AND NOT (s.state = 'a' AND s.until > now()))
                 AS too_often,
             min(s.acquired_at) FILTER (WHERE s.state IN ('a', 'd') AND s.until > now()) AS oldest_lock
        FROM {schema}.share_events s
       WHERE s.group_name = sp.group_name AND s.topic_id = sp.topic_id AND s.partition = sp.partition
  ) st ON true;
