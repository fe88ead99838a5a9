-- Operations: topic configuration (kept in topics.config), retention by whole segments, segment
-- statistics that keep lag and counts off the log, data-loss bookkeeping of groups, and the maintenance
-- pass (SQL function maintain(), also run by pg_cron). Rendered with the target schema as {schema};
-- literal braces are doubled.
--
-- A segment is *sealed* once every partition's read fence is past its last position: no event can
-- appear in it any more, so its per-partition figures (events, first and last position, newest event)
-- are final and are recorded once in segment_partitions. Retention only ever removes sealed segments,
-- oldest first. A segment to remove is first marked (segments.removing_at, segment_partitions.removed_at,
-- committed), then detached and dropped: a reader that finds its cursor before a removed segment's events
-- learns of the loss from the marks (see pgstreams.consumer.reader).

ALTER TABLE {schema}.segments
    ADD COLUMN sealed_at   timestamptz,
    ADD COLUMN events      bigint,
    ADD COLUMN newest_at   timestamptz,
    ADD COLUMN removing_at timestamptz;

CREATE TABLE {schema}.segment_partitions (
    topic_id       integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    segment        bigint      NOT NULL,
    partition      integer     NOT NULL,
    lo             bigint      NOT NULL,
    hi             bigint      NOT NULL,
    events         bigint      NOT NULL,
    first_position bigint      NOT NULL,
    last_position  bigint      NOT NULL,
    newest_at      timestamptz,
    removed_at     timestamptz,
    PRIMARY KEY (topic_id, segment, partition)
);
CREATE INDEX segment_partitions_removed_idx ON {schema}.segment_partitions (topic_id, partition, last_position)
 WHERE removed_at IS NOT NULL;

-- Per topic: when retention last ran on it and what it removed so far.
CREATE TABLE {schema}.topic_retention (
    topic_id         integer     PRIMARY KEY REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    ran_at           timestamptz,
    segments_removed bigint      NOT NULL DEFAULT 0,
    events_removed   bigint      NOT NULL DEFAULT 0,
    bytes_removed    bigint      NOT NULL DEFAULT 0
);

-- Events a group never read because retention removed them first, per removed segment (recorded once
-- per group, partition and segment however many consumers notice it).
CREATE TABLE {schema}.group_losses (
    group_name  text        NOT NULL,
    topic_id    integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    partition   integer     NOT NULL,
    segment     bigint      NOT NULL,
    events      bigint      NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic_id, partition, segment)
);

-- The last maintenance pass of the schema (one row).
CREATE TABLE {schema}.maintenance (
    only_row    boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    ran_at      timestamptz,
    duration_ms double precision,
    runner      text,
    summary     jsonb
);
INSERT INTO {schema}.maintenance (only_row) VALUES (true);

-- A numeric setting of a topic's configuration; NULL when absent or -1 (unlimited).
CREATE FUNCTION {schema}.topic_limit(p_config jsonb, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT NULLIF((p_config ->> p_key)::bigint, -1);
$$;

-- Seal the segments of a topic that every partition's read fence has passed: record their figures per
-- partition (one scan of each, once in its life). Oldest first; returns how many were sealed.
CREATE FUNCTION {schema}.seal_segments(p_topic_id integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_parts  integer;
    v_fence  bigint;
    v_n      integer := 0;
    r        record;
BEGIN
    SELECT partitions INTO v_parts FROM {schema}.topics WHERE id = p_topic_id;
    IF v_parts IS NULL THEN
        RETURN 0;
    END IF;
    -- a statement of its own: the scans below run in later statements, with newer snapshots
    SELECT min(f) INTO v_fence
      FROM unnest({schema}.partition_fences(
               p_topic_id, ARRAY(SELECT generate_series(0, v_parts - 1)),
               format('%I.%I', '{schema_raw}', 'topic_' || p_topic_id || '_seq')::regclass)) AS f;
    FOR r IN SELECT s.segment, s.lo, s.hi FROM {schema}.segments s
              WHERE s.topic_id = p_topic_id AND s.sealed_at IS NULL AND s.hi <= v_fence
              ORDER BY s.segment LOOP
        EXECUTE format(
            'INSERT INTO %1$I.segment_partitions (topic_id, segment, partition, lo, hi, events, first_position,'
            '                                     last_position, newest_at)'
            ' SELECT $1, $2, e.partition, $3, $4, count(*), min(e.position), max(e.position), max(e.created_at)'
            '   FROM %1$I.%2$I e GROUP BY e.partition'
            ' ON CONFLICT DO NOTHING',
            '{schema_raw}', 'topic_' || p_topic_id || '_s' || r.segment)
          USING p_topic_id, r.segment, r.lo, r.hi;
        UPDATE {schema}.segments s
           SET sealed_at = now(),
               events = coalesce((SELECT sum(sp.events) FROM {schema}.segment_partitions sp
                                   WHERE sp.topic_id = p_topic_id AND sp.segment = r.segment), 0),
               newest_at = (SELECT max(sp.newest_at) FROM {schema}.segment_partitions sp
                             WHERE sp.topic_id = p_topic_id AND sp.segment = r.segment)
         WHERE s.topic_id = p_topic_id AND s.segment = r.segment;
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END;
$$;

-- The segments retention removes now, oldest first: a prefix of the sealed segments not yet being
-- removed, each removed when one policy of the topic's configuration says so (Kafka's rules, per topic):
--   retention.ms      its newest event is older than p_now - retention.ms;
--   retention.events  the topic keeps at least retention.events events without it;
--   retention.bytes   the topic keeps at least retention.bytes bytes on disk without it.
-- Events of unsealed segments are counted (at most the last segments); sizes are the segments' relation
-- sizes (table, index and TOAST).
CREATE FUNCTION {schema}.retention_plan(p_topic_id integer, p_now timestamptz)
RETURNS TABLE (segment bigint, events bigint, bytes bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_config  jsonb;
    v_ms      bigint;
    v_events  bigint;
    v_bytes   bigint;
    v_total_e bigint := 0;
    v_total_b bigint := 0;
    v_sealed  bigint;
    r         record;
BEGIN
    SELECT t.config INTO v_config FROM {schema}.topics t WHERE t.id = p_topic_id;
    IF v_config IS NULL OR coalesce(v_config ->> 'cleanup.policy', 'delete') <> 'delete' THEN
        RETURN;
    END IF;
    v_ms := {schema}.topic_limit(v_config, 'retention.ms');
    v_events := {schema}.topic_limit(v_config, 'retention.events');
    v_bytes := {schema}.topic_limit(v_config, 'retention.bytes');
    IF v_ms IS NULL AND v_events IS NULL AND v_bytes IS NULL THEN
        RETURN;
    END IF;
    IF v_events IS NOT NULL THEN
        SELECT coalesce(sum(s.events), 0), max(s.hi) INTO v_total_e, v_sealed FROM {schema}.segments s
         WHERE s.topic_id = p_topic_id AND s.sealed_at IS NOT NULL AND s.removing_at IS NULL;
        EXECUTE format('SELECT count(*) FROM %I.%I WHERE position >= $1', '{schema_raw}', 'topic_' || p_topic_id)
           INTO r USING coalesce(v_sealed, 0);
        v_total_e := v_total_e + r.count;
    END IF;
    IF v_bytes IS NOT NULL THEN
        SELECT coalesce(sum(pg_total_relation_size(
                   to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || p_topic_id || '_s' || s.segment)))), 0)
          INTO v_total_b FROM {schema}.segments s
         WHERE s.topic_id = p_topic_id AND s.removing_at IS NULL;
    END IF;
    FOR r IN SELECT s.segment, s.events, s.newest_at,
                    coalesce(pg_total_relation_size(to_regclass(format(
                        '%I.%I', '{schema_raw}', 'topic_' || p_topic_id || '_s' || s.segment))), 0) AS bytes
               FROM {schema}.segments s
              WHERE s.topic_id = p_topic_id AND s.sealed_at IS NOT NULL AND s.removing_at IS NULL
              ORDER BY s.segment LOOP
        IF (v_ms IS NOT NULL AND (r.newest_at IS NULL OR r.newest_at < p_now - v_ms * interval '1 millisecond'))
           OR (v_events IS NOT NULL AND v_total_e - r.events >= v_events)
           OR (v_bytes IS NOT NULL AND v_total_b - r.bytes >= v_bytes) THEN
            v_total_e := v_total_e - r.events;
            v_total_b := v_total_b - r.bytes;
            segment := r.segment;
            events := r.events;
            bytes := r.bytes;
            RETURN NEXT;
        ELSE
            EXIT;
        END IF;
    END LOOP;
END;
$$;

-- Mark segments as being removed (before they are detached and dropped) and count them as removed.
CREATE FUNCTION {schema}.mark_removing(p_topic_id integer, p_segments bigint[], p_events bigint, p_bytes bigint)
RETURNS void
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
END;
$$;

-- Record that retention ran on a topic (whether or not it removed anything).
CREATE FUNCTION {schema}.retention_ran(p_topic_id integer) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO {schema}.topic_retention AS t (topic_id, ran_at) VALUES (p_topic_id, now())
    ON CONFLICT (topic_id) DO UPDATE SET ran_at = now();
$$;

-- Drop a marked segment inside the caller's transaction (the path of maintain(), which pg_cron runs in
-- one transaction, where DETACH ... CONCURRENTLY is not allowed). DROP takes an ACCESS EXCLUSIVE lock on
-- the topic table for a moment; waiting for it is bounded by p_lock_timeout_ms: a busy topic's segment
-- is left for a later pass (false).
CREATE FUNCTION {schema}.drop_segment(p_topic_id integer, p_segment bigint, p_lock_timeout_ms integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_old text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    BEGIN
        EXECUTE format('DROP TABLE IF EXISTS %I.%I', '{schema_raw}', 'topic_' || p_topic_id || '_s' || p_segment);
        DELETE FROM {schema}.segments WHERE topic_id = p_topic_id AND segment = p_segment;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', v_old, true);
        RETURN false;
    END;
    PERFORM set_config('lock_timeout', v_old, true);
    RETURN true;
END;
$$;

-- Keep segments ahead of the publishers (two empty ones: no publish pays a CREATE TABLE while
-- maintenance runs at least once per segment filled) and give the segment being filled statistics.
CREATE FUNCTION {schema}.prepare_segments(p_topic_id integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_size bigint;
    v_last bigint;
    v_had  bigint;
    v_now  bigint;
BEGIN
    SELECT segment_size INTO v_size FROM {schema}.topics WHERE id = p_topic_id;
    IF v_size IS NULL THEN
        RETURN 0;
    END IF;
    v_last := coalesce(pg_sequence_last_value(
        format('%I.%I', '{schema_raw}', 'topic_' || p_topic_id || '_seq')::regclass), 0);
    SELECT count(*) INTO v_had FROM {schema}.segments WHERE topic_id = p_topic_id;
    PERFORM {schema}.ensure_segments(p_topic_id, v_last + 2 * v_size);
    SELECT count(*) INTO v_now FROM {schema}.segments WHERE topic_id = p_topic_id;
    IF v_last > 0 THEN
        PERFORM {schema}.analyze_segment(p_topic_id, v_last);
    END IF;
    RETURN v_now - v_had;
END;
$$;

-- Expire the members of every group that missed their session timeout, as a balancing run does for its
-- own group: their leases go to the member waiting for them if it is alive, else become unowned, with a
-- new epoch. Returns the number of members expired.
CREATE FUNCTION {schema}.expire_members() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := 0;
    r   record;
BEGIN
    FOR r IN SELECT DISTINCT m.group_name, m.topic_id FROM {schema}.members m
              WHERE m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond' LOOP
        PERFORM pg_advisory_xact_lock(hashtext('pgstreams.leases'), hashtext(r.group_name || '/' || r.topic_id));
        WITH gone AS (
            DELETE FROM {schema}.members m
             WHERE m.group_name = r.group_name AND m.topic_id = r.topic_id
               AND m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond'
            RETURNING 1)
        SELECT v_n + count(*) INTO v_n FROM gone;
        PERFORM 1 FROM {schema}.leases l WHERE l.group_name = r.group_name AND l.topic_id = r.topic_id
          ORDER BY l.partition FOR UPDATE;
        UPDATE {schema}.leases l
           SET owner = CASE WHEN EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = l.group_name
                                            AND m.topic_id = l.topic_id AND m.member_id = l.new_owner)
                            THEN l.new_owner END,
               new_owner = NULL, epoch = l.epoch + 1, acquired_at = now()
         WHERE l.group_name = r.group_name AND l.topic_id = r.topic_id AND l.owner IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = l.group_name
                              AND m.topic_id = l.topic_id AND m.member_id = l.owner);
        UPDATE {schema}.leases l SET new_owner = NULL
         WHERE l.group_name = r.group_name AND l.topic_id = r.topic_id AND l.new_owner IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = l.group_name
                              AND m.topic_id = l.topic_id AND m.member_id = l.new_owner);
    END LOOP;
    RETURN v_n;
END;
$$;

-- One maintenance pass in one transaction: for every topic, segments ahead and statistics, sealing,
-- retention (segments dropped here, each waiting at most p_lock_timeout_ms for its lock), then stale
-- members expired. Only one pass of a schema runs at a time: a pass that finds another one running
-- returns {{"skipped": true}}. This is what pg_cron runs; pgstreams' own maintenance (client.maintain(),
-- `pgstreams maintain`, the workers' maintenance service) does the same steps but detaches segments
-- with DETACH PARTITION ... CONCURRENTLY, which never blocks publishers or readers.
CREATE FUNCTION {schema}.maintain(p_lock_timeout_ms integer DEFAULT 100) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_start   timestamptz := clock_timestamp();
    v_created integer := 0;
    v_sealed  integer := 0;
    v_removed integer := 0;
    v_events  bigint := 0;
    v_expired integer;
    v_segs    bigint[];
    v_ev      bigint;
    v_by      bigint;
    v_summary jsonb;
    t         record;
    s         record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pgstreams.maintain'), hashtext('{schema_raw}')) THEN
        RETURN jsonb_build_object('skipped', true);
    END IF;
    FOR t IN SELECT id FROM {schema}.topics ORDER BY id LOOP
        v_created := v_created + {schema}.prepare_segments(t.id);
        v_sealed := v_sealed + {schema}.seal_segments(t.id);
        SELECT array_agg(p.segment ORDER BY p.segment), coalesce(sum(p.events), 0), coalesce(sum(p.bytes), 0)
          INTO v_segs, v_ev, v_by FROM {schema}.retention_plan(t.id, now()) p;
        IF v_segs IS NOT NULL THEN
            PERFORM {schema}.mark_removing(t.id, v_segs, v_ev, v_by);
            v_events := v_events + v_ev;
        ELSE
            PERFORM {schema}.retention_ran(t.id);
        END IF;
        FOR s IN SELECT segment FROM {schema}.segments
                  WHERE topic_id = t.id AND removing_at IS NOT NULL ORDER BY segment LOOP
            IF {schema}.drop_segment(t.id, s.segment, p_lock_timeout_ms) THEN
                v_removed := v_removed + 1;
            END IF;
        END LOOP;
    END LOOP;
    v_expired := {schema}.expire_members();
    v_summary := jsonb_build_object(
        'segments_created', v_created, 'segments_sealed', v_sealed, 'segments_removed', v_removed,
        'events_removed', v_events, 'members_expired', v_expired);
    UPDATE {schema}.maintenance
       SET ran_at = now(), duration_ms = extract(epoch FROM clock_timestamp() - v_start) * 1000,
           runner = 'sql', summary = v_summary;
    RETURN v_summary;
END;
$$;

-- Head and lag of one partition after a checkpoint without scanning the log: sealed segments wholly
-- after the checkpoint count from their statistics; only the segment holding the checkpoint and the
-- unsealed ones (the last one or two) are counted row by row.
CREATE OR REPLACE FUNCTION {schema}.partition_progress(
    p_topic_id integer, p_partition integer, p_position bigint, OUT head bigint, OUT lag bigint
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_size   bigint;
    v_sealed bigint;
    v_next   bigint;
    v_stats  bigint;
    v_live   bigint;
    v_tail   bigint;
BEGIN
    SELECT t.segment_size, (SELECT max(s.hi) FROM {schema}.segments s
                             WHERE s.topic_id = t.id AND s.sealed_at IS NOT NULL)
      INTO v_size, v_sealed FROM {schema}.topics t WHERE t.id = p_topic_id;
    v_sealed := coalesce(v_sealed, 0);
    v_next := (p_position / v_size + 1) * v_size;  -- the end of the segment holding the checkpoint
    IF v_next >= v_sealed THEN
        EXECUTE format(
            'SELECT (SELECT e.position FROM %1$I.%2$I e WHERE e.partition = $1 ORDER BY e.position DESC LIMIT 1),'
            '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND e.position > $2)',
            '{schema_raw}', 'topic_' || p_topic_id)
          INTO head, lag USING p_partition, p_position;
        RETURN;
    END IF;
    SELECT coalesce(sum(sp.events), 0) INTO v_stats FROM {schema}.segment_partitions sp
     WHERE sp.topic_id = p_topic_id AND sp.partition = p_partition AND sp.removed_at IS NULL
       AND sp.lo >= v_next AND sp.hi <= v_sealed;
    EXECUTE format(
        'SELECT (SELECT e.position FROM %1$I.%2$I e WHERE e.partition = $1 ORDER BY e.position DESC LIMIT 1),'
        '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND e.position > $2 AND e.position < $3),'
        '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND e.position >= $4)',
        '{schema_raw}', 'topic_' || p_topic_id)
      INTO head, v_live, v_tail USING p_partition, p_position, v_next, v_sealed;
    lag := v_stats + v_live + v_tail;
END;
$$;

-- Per partition: the events removed by retention after a position (the checkpoint of a group), those
-- of the segment holding the position estimated from positions. What a group behind retention lost.
CREATE FUNCTION {schema}.removed_after(p_topic_id integer, p_partition integer, p_position bigint)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(CASE WHEN sp.first_position > p_position THEN sp.events
                             ELSE greatest(1, round(sp.events::numeric * (sp.last_position - p_position)
                                                    / (sp.last_position - sp.first_position + 1)))::bigint
                        END), 0)
      FROM {schema}.segment_partitions sp
     WHERE sp.topic_id = p_topic_id AND sp.partition = p_partition AND sp.removed_at IS NOT NULL
       AND sp.last_position > p_position;
$$;

-- The oldest retained event of a topic (its position and time), by one index probe per partition.
CREATE FUNCTION {schema}.oldest_event(p_topic_id integer, OUT "position" bigint, OUT created_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_parts integer;
    v_from  bigint;
BEGIN
    SELECT t.partitions, coalesce((SELECT min(s.lo) FROM {schema}.segments s
                                    WHERE s.topic_id = t.id AND s.removing_at IS NULL), 0)
      INTO v_parts, v_from FROM {schema}.topics t WHERE t.id = p_topic_id;
    EXECUTE format(
        'SELECT f.position, f.created_at FROM generate_series(0, $1 - 1) AS p(p)'
        ' CROSS JOIN LATERAL (SELECT e.position, e.created_at FROM %1$I.%2$I e'
        '                      WHERE e.partition = p.p AND e.position >= $2 ORDER BY e.position LIMIT 1) f'
        ' ORDER BY f.position LIMIT 1', '{schema_raw}', 'topic_' || p_topic_id)
      INTO "position", created_at USING v_parts, v_from;
END;
$$;

-- Per topic: its retention policy (NULL: unlimited), the oldest retained event, size on disk, segments,
-- and when retention last ran and what it removed so far.
CREATE VIEW {schema}.retention_status AS
SELECT t.name AS topic, t.id AS topic_id,
       coalesce(t.config ->> 'cleanup.policy', 'delete') AS cleanup_policy,
       {schema}.topic_limit(t.config, 'retention.ms') AS retention_ms,
       {schema}.topic_limit(t.config, 'retention.events') AS retention_events,
       {schema}.topic_limit(t.config, 'retention.bytes') AS retention_bytes,
       o.position AS oldest_position, o.created_at AS oldest_at,
       (SELECT coalesce(sum(pg_total_relation_size(pt.relid)), 0)
          FROM pg_partition_tree(format('%I.%I', '{schema_raw}', 'topic_' || t.id)::regclass) pt) AS bytes,
       (SELECT count(*) FROM {schema}.segments s WHERE s.topic_id = t.id AND s.removing_at IS NULL) AS segments,
       r.ran_at AS retention_ran_at,
       coalesce(r.segments_removed, 0) AS segments_removed,
       coalesce(r.events_removed, 0) AS events_removed,
       coalesce(r.bytes_removed, 0) AS bytes_removed
  FROM {schema}.topics t
  LEFT JOIN {schema}.topic_retention r ON r.topic_id = t.id
 CROSS JOIN LATERAL {schema}.oldest_event(t.id) o;
