-- pgstreams initial schema.
-- Rendered with the target schema as {schema}; literal braces are doubled.

CREATE TABLE {schema}.topics (
    id           integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL UNIQUE,
    partitions   integer     NOT NULL CHECK (partitions BETWEEN 1 AND 1024),
    segment_size bigint      NOT NULL CHECK (segment_size >= 1000),
    config       jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Every topic stores its events in its own table "topic_<id>", partitioned by RANGE (position) into
-- segments of segment_size positions ("topic_<id>_s<n>"). Retention drops whole segments.
CREATE TABLE {schema}.segments (
    topic_id   integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    segment    bigint      NOT NULL,
    lo         bigint      NOT NULL,
    hi         bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, segment)
);

-- Idempotent publishing: the first (partition, position) stored for an event id of a topic.
CREATE TABLE {schema}.event_ids (
    topic_id  integer NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    event_id  text    NOT NULL,
    partition integer NOT NULL,
    position  bigint  NOT NULL,
    PRIMARY KEY (topic_id, event_id)
);

-- Stream-group checkpoints: the last consumed (xid, position) per (group, topic, partition).
-- Read order within a partition is (xid, position); (0, 0) is "before everything".
CREATE TABLE {schema}.checkpoints (
    group_name text        NOT NULL,
    topic_id   integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    partition  integer     NOT NULL,
    xid        xid8        NOT NULL,
    position   bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic_id, partition)
);
CREATE INDEX checkpoints_topic_idx ON {schema}.checkpoints (topic_id);

-- Create the segment that holds position p of a topic (and every missing one before it back to the
-- last existing segment). Concurrent callers are serialised per topic. CREATE TABLE + ATTACH PARTITION
-- takes only SHARE UPDATE EXCLUSIVE on the topic table, so publishers and readers are not blocked.
CREATE FUNCTION {schema}.ensure_segments(p_topic_id integer, p_upto bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_size  bigint;
    v_last  bigint;
    v_seg   bigint;
    v_table text;
    v_child text;
BEGIN
    SELECT segment_size INTO v_size FROM {schema}.topics WHERE id = p_topic_id;
    IF v_size IS NULL THEN
        RAISE EXCEPTION 'topic id % does not exist', p_topic_id USING ERRCODE = 'P0002';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('pgstreams.segments'), p_topic_id);
    SELECT max(segment) INTO v_last FROM {schema}.segments WHERE topic_id = p_topic_id;
    v_table := 'topic_' || p_topic_id;
    v_seg := COALESCE(v_last + 1, 0);
    WHILE v_seg <= p_upto / v_size LOOP
        v_child := v_table || '_s' || v_seg;
        EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS)',
                       '{schema_raw}', v_child, '{schema_raw}', v_table);
        EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I CHECK (position >= %s AND position < %s)',
                       '{schema_raw}', v_child, v_child || '_range', v_seg * v_size, (v_seg + 1) * v_size);
        EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
                       '{schema_raw}', v_table, '{schema_raw}', v_child, v_seg * v_size, (v_seg + 1) * v_size);
        INSERT INTO {schema}.segments (topic_id, segment, lo, hi)
        VALUES (p_topic_id, v_seg, v_seg * v_size, (v_seg + 1) * v_size);
        v_seg := v_seg + 1;
    END LOOP;
    RETURN (SELECT max(hi) FROM {schema}.segments WHERE topic_id = p_topic_id);
END;
$$;

-- Create the storage of a topic: its sequence, its partitioned event table, index and first segments.
CREATE FUNCTION {schema}.create_topic_storage(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_table text := 'topic_' || p_topic_id;
    v_size  bigint;
BEGIN
    SELECT segment_size INTO v_size FROM {schema}.topics WHERE id = p_topic_id;
    EXECUTE format('CREATE SEQUENCE %I.%I AS bigint START 1 CACHE 1', '{schema_raw}', v_table || '_seq');
    EXECUTE format($f$
        CREATE TABLE %1$I.%2$I (
            partition      integer     NOT NULL,
            position       bigint      NOT NULL DEFAULT nextval(%3$L::regclass),
            xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
            created_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
            kind           "char"      NOT NULL,
            key            text,
            value          bytea       NOT NULL,
            headers        jsonb,
            event_type     text,
            event_id       text,
            correlation_id text,
            causation_id   text
        ) PARTITION BY RANGE (position)$f$,
        '{schema_raw}', v_table, quote_ident('{schema_raw}') || '.' || quote_ident(v_table || '_seq'));
    EXECUTE format('CREATE INDEX %I ON %I.%I (partition, xid, position)',
                   v_table || '_read_idx', '{schema_raw}', v_table);
    RETURN {schema}.ensure_segments(p_topic_id, v_size);
END;
$$;

-- The read fence: the oldest transaction running in the current snapshot, skipping those known (from
-- pg_stat_activity) to run in another database, which cannot write this database's events (a busy
-- neighbour database would otherwise hold back every consumer here). A transaction not known to run
-- elsewhere (ended meanwhile, prepared, ...) still counts. With none, the snapshot's xmax. Every event
-- with a smaller xid is committed or rolled back, and no new one can appear: readers read only below it.
-- STABLE, so the planner evaluates it when estimating a poll (all rows are below it: read them in index
-- order rather than sort them). A poll calls it once per index scan (partitions x segments): reading
-- pg_stat_activity costs ~0.1 ms, so the result is kept per snapshot in two session settings (the same
-- snapshot always has the same fence).
CREATE FUNCTION {schema}.read_fence() RETURNS xid8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_snap  pg_snapshot := pg_current_snapshot();
    v_key   text;
    v_fence xid8;
BEGIN
    IF pg_snapshot_xmin(v_snap) = pg_snapshot_xmax(v_snap) THEN
        RETURN pg_snapshot_xmax(v_snap);  -- nothing running
    END IF;
    v_key := v_snap::text;
    IF current_setting('pgstreams.read_fence_snapshot', true) = v_key THEN
        RETURN current_setting('pgstreams.read_fence')::xid8;
    END IF;
    SELECT min(x) INTO v_fence FROM pg_snapshot_xip(v_snap) AS x
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a
                        WHERE a.backend_xid = xid(x)
                          AND a.datid <> (SELECT oid FROM pg_database WHERE datname = current_database()));
    v_fence := coalesce(v_fence, pg_snapshot_xmax(v_snap));
    PERFORM set_config('pgstreams.read_fence_snapshot', v_key, false),
            set_config('pgstreams.read_fence', v_fence::text, false);
    RETURN v_fence;
END;
$$;

-- Give the segment of a topic that holds a position column statistics if it has none yet. Until
-- autovacuum analyzes a new segment the planner assumes a poll matches a handful of rows and sorts the
-- whole partition instead of reading its index in order; one ANALYZE of a thousand rows fixes that for
-- the segment's life (row counts then scale with its size). Fewer rows could make ANALYZE take partition
-- numbers for unique values. Concurrent callers skip (advisory lock). Returns false when the segment
-- holds too few rows yet (call again later).
CREATE FUNCTION {schema}.analyze_segment(p_topic_id integer, p_position bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_size bigint;
    v_seg  text;
    v_rows boolean;
BEGIN
    SELECT segment_size INTO v_size FROM {schema}.topics WHERE id = p_topic_id;
    IF v_size IS NULL THEN
        RETURN true;
    END IF;
    v_seg := 'topic_' || p_topic_id || '_s' || (p_position / v_size);
    IF to_regclass(format('%I.%I', '{schema_raw}', v_seg)) IS NULL
       OR EXISTS (SELECT 1 FROM pg_stats
                   WHERE schemaname = '{schema_raw}' AND tablename = v_seg AND attname = 'partition')
       OR NOT pg_try_advisory_xact_lock(hashtext('pgstreams.analyze_segment'), p_topic_id) THEN
        RETURN true;
    END IF;
    EXECUTE format('SELECT count(*) >= %1$s FROM (SELECT FROM %2$I.%3$I LIMIT %1$s) s',
                   least(1000, v_size / 2), '{schema_raw}', v_seg) INTO STRICT v_rows;
    IF NOT v_rows THEN
        RETURN false;
    END IF;
    EXECUTE format('ANALYZE %I.%I', '{schema_raw}', v_seg);
    RETURN true;
END;
$$;

-- Store a checkpoint given the expected previous one. Returns
-- 1 stored, 0 ignored (already stored / would move backwards), 2 further (stored is beyond expected),
-- 3 older (stored is behind expected).
CREATE FUNCTION {schema}.store_checkpoint(
    p_group text, p_topic_id integer, p_partition integer,
    p_xid xid8, p_position bigint, p_expected_xid xid8, p_expected_position bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_xid xid8;
    v_pos bigint;
BEGIN
    SELECT xid, position INTO v_xid, v_pos FROM {schema}.checkpoints
     WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, xid, position)
        VALUES (p_group, p_topic_id, p_partition, p_xid, p_position)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN 1;
        END IF;
        SELECT xid, position INTO v_xid, v_pos FROM {schema}.checkpoints
         WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
           FOR UPDATE;
    END IF;
    IF (v_xid, v_pos) = (p_xid, p_position) THEN
        RETURN 0;
    ELSIF (v_xid, v_pos) = (p_expected_xid, p_expected_position) THEN
        IF (p_xid, p_position) < (v_xid, v_pos) THEN
            RETURN 0;
        END IF;
        UPDATE {schema}.checkpoints SET xid = p_xid, position = p_position, updated_at = now()
         WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition;
        RETURN 1;
    ELSIF (v_xid, v_pos) > (p_expected_xid, p_expected_position) THEN
        RETURN 2;
    ELSE
        RETURN 3;
    END IF;
END;
$$;
