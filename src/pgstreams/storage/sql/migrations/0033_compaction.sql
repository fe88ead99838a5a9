-- Compacted topics (cleanup.policy = compact or compact,delete): the latest event per key, tombstones, and
-- compaction by rewriting whole sealed segments.
--
-- Tombstones. An event's value may now be NULL: a tombstone (a key without a value). The Python producer
-- stores the value None of an event with a key as one, the SQL publish() a NULL value with a key. A
-- compacted topic refuses events without a key.
--
-- The key map. Once a segment is sealed (no event can appear in it any more), compaction *maps* it, once in
-- its life, oldest first: compaction_keys keeps per (topic, partition, key) the position of the key's latest
-- event among the mapped segments; mapping a segment moves its keys' entries forward and counts, in
-- segments.superseded, the events each older segment holds that have a newer event of their key (the
-- events inside the segment with a later one of their key in it too). So a segment's dirty ratio
-- (superseded / events) is known without reading it again.
--
-- The rewrite. A mapped segment whose dirty ratio passed min.cleanable.dirty.ratio (or whose oldest event
-- passed max.compaction.lag.ms, or that holds tombstones older than delete.retention.ms, or the older events
-- of a key whose tombstone expired), whose newest event is older than min.compaction.lag.ms and that no
-- reader pinned (segment_pins), is rewritten: its survivors (the latest event of each
-- key, events without a key, tombstones not expired yet or whose key still has older events in the
-- topic) are copied into a fresh table <segment>_c with the segment's index and a CHECK of its range
-- (compact_build(): no lock on the topic table), which then replaces the segment in one short transaction
-- (compact_swap(): DETACH, two renames and ATTACH, which the CHECK spares its validating scan; it waits at
-- most a lock timeout for the topic table's lock and is tried again at the next pass otherwise). The old
-- table, renamed <segment>_x, is dropped after that commit. Readers see the old segment or the new one,
-- never neither: positions never change and survivors are the same rows in both, so a reader's cursor goes
-- on from the next survivor. No DELETE, no dead tuple in the topic's tables.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

DO $$
DECLARE
    v_id integer;
BEGIN
    FOR v_id IN SELECT id FROM {schema}.topics ORDER BY id LOOP
        EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN value DROP NOT NULL', '{schema_raw}', 'topic_' || v_id);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.create_topic_storage(p_topic_id integer) RETURNS bigint
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
            value          bytea,
            headers        jsonb,
            event_type     text,
            event_id       text,
            correlation_id text,
            causation_id   text,
            producer       bigint
        ) PARTITION BY RANGE (position)$f$,
        '{schema_raw}', v_table, quote_ident('{schema_raw}') || '.' || quote_ident(v_table || '_seq'));
    EXECUTE format('CREATE INDEX %I ON %I.%I (partition, position)',
                   v_table || '_read_idx', '{schema_raw}', v_table);
    RETURN {schema}.ensure_segments(p_topic_id, v_size);
END;
$$;

ALTER TABLE {schema}.segments
    ADD COLUMN mapped_at    timestamptz,
    ADD COLUMN superseded   bigint NOT NULL DEFAULT 0,
    ADD COLUMN oldest_at    timestamptz,
    ADD COLUMN tombstone_at timestamptz,
    ADD COLUMN compacted_at timestamptz;

-- The latest mapped event of each key of a compacted topic, per partition. (No foreign key: its check would
-- cost a third of a mapping's upserts; deleting a topic deletes its keys.)
CREATE TABLE {schema}.compaction_keys (
    topic_id  integer NOT NULL,
    partition integer NOT NULL,
    key       text    NOT NULL,
    position  bigint  NOT NULL,
    PRIMARY KEY (topic_id, partition, key)
);

-- Per partition: the events compaction removed so far (the status's count of events published adds them,
-- as it adds those retention removed).
CREATE TABLE {schema}.partition_compaction (
    topic_id       integer NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    partition      integer NOT NULL,
    events_removed bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
);

-- Compaction's figures are read by every role that reads the status (counts per topic id only).
GRANT SELECT ON {schema}.partition_compaction TO PUBLIC;

-- Per topic: when compaction last rewrote a segment of it and what it removed so far.
CREATE TABLE {schema}.topic_compaction (
    topic_id           integer     PRIMARY KEY REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    ran_at             timestamptz,
    compacted_at       timestamptz,
    segments_rewritten bigint      NOT NULL DEFAULT 0,
    events_removed     bigint      NOT NULL DEFAULT 0,
    tombstones_removed bigint      NOT NULL DEFAULT 0,
    bytes_removed      bigint      NOT NULL DEFAULT 0
);
GRANT SELECT ON {schema}.topic_compaction TO PUBLIC;

-- Whether a topic's configuration compacts it (cleanup.policy compact or compact,delete), and whether it
-- applies retention (delete or compact,delete).
CREATE FUNCTION {schema}.compacts(p_config jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_config ->> 'cleanup.policy', 'delete') IN ('compact', 'compact,delete');
$$;

CREATE FUNCTION {schema}.deletes(p_config jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_config ->> 'cleanup.policy', 'delete') IN ('delete', 'compact,delete');
$$;

-- A millisecond setting of a topic's configuration with its default, as an interval (at most 100 years:
-- Kafka's "never" is the largest 64-bit integer).
CREATE FUNCTION {schema}.topic_ms(p_config jsonb, p_key text, p_default bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT least(coalesce((p_config ->> p_key)::bigint, p_default), 3155760000000) * interval '1 millisecond';
$$;

-- Segments a reader scans by heap page (the Spark data source's batch reads split each segment's pages among
-- tasks, planned before they run): while pinned, a segment is not rewritten (compaction_plan() leaves it out,
-- and compact_swap() gives up), so every task reads the table that was planned.
CREATE TABLE {schema}.segment_pins (
    topic_id integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    lo       bigint      NOT NULL,
    until    timestamptz NOT NULL,
    PRIMARY KEY (topic_id, lo)
);

-- Pin segments of a topic (by their first position; NULL: every segment) for p_seconds from now (a pin
-- only ever grows). Any role that reads may pin (SECURITY DEFINER).
CREATE FUNCTION {schema}.pin_segments(p_topic_id integer, p_los bigint[], p_seconds double precision)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO {schema}.segment_pins AS p (topic_id, lo, until)
    SELECT p_topic_id, s.lo, clock_timestamp() + p_seconds * interval '1 second'
      FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.removing_at IS NULL AND (p_los IS NULL OR s.lo = ANY (p_los))
    ON CONFLICT (topic_id, lo) DO UPDATE SET until = greatest(p.until, excluded.until);
$$;

-- Map the sealed segments of a compacted topic not mapped yet (see above), the oldest p_limit of them (NULL:
-- all) at once: one hash aggregate of their events by key and segment (no sort), then one upsert per key of
-- the key map. Returns how many it mapped. Segments sealed while the topic was not compacted are mapped too
-- once it is.
CREATE FUNCTION {schema}.compaction_map(p_topic_id integer, p_limit integer DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
-- its aggregate by key hashes (spilling to disk if it must) rather than sorts: the planner, which cannot
-- tell how many keys the segments hold, would sort them all (four times slower)
SET enable_sort = off SET work_mem = '256MB' AS $$
DECLARE
    v_segs bigint[];
    v_los  bigint[];
    v_lo   bigint;
    v_hi   bigint;
    v_tomb timestamptz;
    v_seg  bigint;
    x      record;
BEGIN
    SELECT array_agg(s.segment ORDER BY s.segment), array_agg(s.lo ORDER BY s.segment), min(s.lo), max(s.hi)
      INTO v_segs, v_los, v_lo, v_hi
      FROM (SELECT s.segment, s.lo, s.hi FROM {schema}.segments s
             WHERE s.topic_id = p_topic_id AND s.sealed_at IS NOT NULL AND s.mapped_at IS NULL
               AND s.removing_at IS NULL
             ORDER BY s.segment LIMIT p_limit) s;
    IF v_segs IS NULL THEN
        RETURN 0;
    END IF;
    -- per key and segment: the latest position and whether it is a tombstone (the lowest bit of
    -- 2 * position + tombstone), the events, the oldest time; then each key's latest over the segments
    FOR x IN EXECUTE format(
        'WITH g AS MATERIALIZED ('
        '    SELECT e.partition, e.key, width_bucket(e.position, $4) AS b,'
        '           max(e.position * 2 + (e.value IS NULL)::int) AS m, count(*) AS n, min(e.created_at) AS oldest'
        '      FROM %1$I.%2$I e WHERE e.position >= $2 AND e.position < $3'
        '     GROUP BY 1, 2, 3'
        '), latest AS MATERIALIZED ('
        '    SELECT partition, key, max(m) AS m FROM g WHERE key IS NOT NULL GROUP BY partition, key'
        '), prev AS MATERIALIZED ('
        '    SELECT k.position FROM latest l JOIN %1$I.compaction_keys k'
        '        ON k.topic_id = $1 AND k.partition = l.partition AND k.key = l.key AND k.position < l.m / 2'
        '), up AS ('
        '    INSERT INTO %1$I.compaction_keys AS k (topic_id, partition, key, position)'
        '    SELECT $1, l.partition, l.key, l.m / 2 FROM latest l'
        '    ON CONFLICT (topic_id, partition, key) DO UPDATE SET position = excluded.position'
        '     WHERE k.position < excluded.position'
        '), bump AS ('
        '    UPDATE %1$I.segments s SET superseded = s.superseded + b.n'
        '      FROM (SELECT o.segment, count(*) AS n FROM prev p JOIN %1$I.segments o'
        '              ON o.topic_id = $1 AND p.position >= o.lo AND p.position < o.hi'
        '             GROUP BY o.segment) b'
        '     WHERE s.topic_id = $1 AND s.segment = b.segment'
        ')'
        ' SELECT g.b, coalesce(sum(g.n) FILTER (WHERE g.key IS NOT NULL), 0)'
        '             - count(*) FILTER (WHERE g.m = l.m) AS inside,'
        '        min(g.oldest) AS oldest, bool_or(g.m = l.m AND g.m %% 2 = 1) AS tombs'
        '   FROM g LEFT JOIN latest l ON l.partition = g.partition AND l.key = g.key'
        '  GROUP BY g.b',
        '{schema_raw}', 'topic_' || p_topic_id)
      USING p_topic_id, v_lo, v_hi, v_los
    LOOP
        v_seg := v_segs[x.b];
        v_tomb := NULL;
        IF x.tombs THEN  -- the oldest of the latest tombstones (the segment's tombstones are few)
            EXECUTE format(
                'SELECT min(e.created_at) FROM %1$I.%2$I e JOIN %1$I.compaction_keys k'
                '    ON k.topic_id = $1 AND k.partition = e.partition AND k.key = e.key AND k.position = e.position'
                ' WHERE e.value IS NULL', '{schema_raw}', 'topic_' || p_topic_id || '_s' || v_seg)
              INTO v_tomb USING p_topic_id;
        END IF;
        UPDATE {schema}.segments s
           SET superseded = s.superseded + x.inside, oldest_at = x.oldest, tombstone_at = v_tomb
         WHERE s.topic_id = p_topic_id AND s.segment = v_seg;
    END LOOP;
    UPDATE {schema}.segments s SET mapped_at = now()
     WHERE s.topic_id = p_topic_id AND s.segment = ANY (v_segs);
    RETURN cardinality(v_segs);
END;
$$;

-- The segments of a compacted topic to rewrite now, oldest first, and why ('dirty': its dirty ratio passed
-- min.cleanable.dirty.ratio; 'lag': its oldest event passed max.compaction.lag.ms; 'tombstones': it holds
-- tombstones older than delete.retention.ms; 'older': it holds superseded events and a later segment's
-- tombstones expired, which can only go once no older event of their key remains). Only mapped segments
-- not being removed whose newest event is older than min.compaction.lag.ms.
CREATE FUNCTION {schema}.compaction_plan(p_topic_id integer, p_now timestamptz)
RETURNS TABLE (segment bigint, reason text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_config jsonb;
    v_ratio  double precision;
    v_min    interval;
    v_max    interval;
    v_del    interval;
    v_tomb   bigint;
BEGIN
    SELECT t.config INTO v_config FROM {schema}.topics t WHERE t.id = p_topic_id;
    IF v_config IS NULL OR NOT {schema}.compacts(v_config) THEN
        RETURN;
    END IF;
    v_ratio := coalesce((v_config ->> 'min.cleanable.dirty.ratio')::double precision, 0.5);
    v_min := {schema}.topic_ms(v_config, 'min.compaction.lag.ms', 0);
    v_max := {schema}.topic_ms(v_config, 'max.compaction.lag.ms', 9223372036854775807);
    v_del := {schema}.topic_ms(v_config, 'delete.retention.ms', 86400000);
    SELECT max(s.segment) INTO v_tomb FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.mapped_at IS NOT NULL AND s.removing_at IS NULL
       AND s.newest_at < p_now - v_min AND s.tombstone_at < p_now - v_del;
    RETURN QUERY
    SELECT s.segment,
           CASE WHEN s.superseded > 0 AND s.superseded >= v_ratio * greatest(s.events, 1) THEN 'dirty'
                WHEN s.superseded > 0 AND s.oldest_at < p_now - v_max THEN 'lag'
                WHEN s.tombstone_at < p_now - v_del THEN 'tombstones'
                ELSE 'older' END
      FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.mapped_at IS NOT NULL AND s.removing_at IS NULL
       AND s.newest_at < p_now - v_min
       AND NOT EXISTS (SELECT 1 FROM {schema}.segment_pins p
                        WHERE p.topic_id = p_topic_id AND p.lo = s.lo AND p.until > clock_timestamp())
       AND ((s.superseded > 0 AND (s.superseded >= v_ratio * greatest(s.events, 1)
                                   OR s.oldest_at < p_now - v_max OR s.segment < v_tomb))
            OR s.tombstone_at < p_now - v_del)
     ORDER BY s.segment;
END;
$$;

-- Drop what an interrupted compaction left: copies never attached (<segment>_c) and replaced segments not
-- dropped yet (<segment>_x); forget the topic's pins that ran out. Returns how many tables it dropped.
CREATE FUNCTION {schema}.compaction_leftovers(p_topic_id integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer := 0;
    r   record;
BEGIN
    DELETE FROM {schema}.segment_pins p WHERE p.topic_id = p_topic_id AND p.until < clock_timestamp();
    FOR r IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = '{schema_raw}' AND c.relkind = 'r' AND NOT c.relispartition
                AND c.relname ~ ('^topic_' || p_topic_id || '_s[0-9]+_[cx]$') LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I.%I', '{schema_raw}', r.relname);
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END;
$$;

-- Copy the survivors of a segment of a compacted topic into <segment>_c (see above), as of p_now. Tombstones
-- older than delete.retention.ms go too when no older segment holds a superseded event (then no older
-- event of their key remains: every such event is superseded by the tombstone). Returns the events kept,
-- removed, and the tombstones among those removed; when nothing would be removed the copy is dropped and
-- (kept, 0, 0) returned.
CREATE FUNCTION {schema}.compact_build(p_topic_id integer, p_segment bigint, p_now timestamptz,
                                       OUT kept bigint, OUT removed bigint, OUT tombstones bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_config jsonb;
    v_lo     bigint;
    v_hi     bigint;
    v_events bigint;
    v_expire timestamptz;
    v_tomb_at timestamptz;
    v_cols   text;
    v_seg    text := 'topic_' || p_topic_id || '_s' || p_segment;
    v_new    text := 'topic_' || p_topic_id || '_s' || p_segment || '_c';
BEGIN
    SELECT t.config INTO v_config FROM {schema}.topics t WHERE t.id = p_topic_id;
    SELECT s.lo, s.hi, s.events, s.tombstone_at INTO v_lo, v_hi, v_events, v_tomb_at FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.segment = p_segment AND s.mapped_at IS NOT NULL
       AND s.removing_at IS NULL;
    IF v_lo IS NULL OR v_config IS NULL OR NOT {schema}.compacts(v_config) THEN
        kept := 0; removed := 0; tombstones := 0;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {schema}.segments s
                    WHERE s.topic_id = p_topic_id AND s.segment < p_segment AND s.superseded > 0
                      AND s.removing_at IS NULL) THEN
        v_expire := p_now - {schema}.topic_ms(v_config, 'delete.retention.ms', 86400000);
    END IF;
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO v_cols
      FROM pg_attribute a
     WHERE a.attrelid = format('%I.%I', '{schema_raw}', 'topic_' || p_topic_id)::regclass
       AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('DROP TABLE IF EXISTS %I.%I', '{schema_raw}', v_new);
    EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS)',
                   '{schema_raw}', v_new, '{schema_raw}', 'topic_' || p_topic_id);
    EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I CHECK (position >= %s AND position < %s)',
                   '{schema_raw}', v_new, v_new || '_range', v_lo, v_hi);
    EXECUTE format(
        'WITH ins AS ('
        '    INSERT INTO %1$I.%3$I (%4$s)'
        '    SELECT %5$s FROM %1$I.%2$I e'
        '      LEFT JOIN %1$I.compaction_keys k'
        '        ON k.topic_id = $1 AND k.partition = e.partition AND k.key = e.key AND k.position = e.position'
        '     WHERE e.key IS NULL'
        '        OR (k.position IS NOT NULL'
        '            AND NOT (e.value IS NULL AND $2::timestamptz IS NOT NULL AND e.created_at < $2))'
        '     ORDER BY e.position'
        '    RETURNING 1)'
        ' SELECT count(*) FROM ins',
        '{schema_raw}', v_seg, v_new, v_cols,
        (SELECT string_agg('e.' || c, ', ') FROM unnest(string_to_array(v_cols, ', ')) AS c))
      INTO kept USING p_topic_id, v_expire;
    tombstones := 0;
    IF v_expire IS NOT NULL AND v_tomb_at < v_expire THEN  -- tombstones may have expired: count them
        EXECUTE format(
            'SELECT count(*) FROM %1$I.%2$I e JOIN %1$I.compaction_keys k'
            '    ON k.topic_id = $1 AND k.partition = e.partition AND k.key = e.key AND k.position = e.position'
            ' WHERE e.value IS NULL AND e.created_at < $2', '{schema_raw}', v_seg)
          INTO tombstones USING p_topic_id, v_expire;
    END IF;
    removed := v_events - kept;
    IF removed = 0 THEN
        EXECUTE format('DROP TABLE %I.%I', '{schema_raw}', v_new);
        tombstones := 0;
        RETURN;
    END IF;
    EXECUTE format('CREATE INDEX ON %I.%I (partition, position)', '{schema_raw}', v_new);
    EXECUTE format('ANALYZE %I.%I', '{schema_raw}', v_new);
END;
$$;

-- Replace a segment by its compacted copy (compact_build()) in the caller's transaction, waiting at most
-- p_lock_timeout_ms for the topic table's lock (false: not replaced, tried again by a later pass; the copy
-- stays until then). The segment's figures are recorded again from the copy, the removed tombstones'
-- keys leave the key map, and the topic's compaction counters grow. The replaced table is renamed
-- <segment>_x: compaction_leftovers() drops it (after this transaction commits).
CREATE FUNCTION {schema}.compact_swap(p_topic_id integer, p_segment bigint, p_removed bigint, p_tombstones bigint, p_lock_timeout_ms integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_old    text := current_setting('lock_timeout');
    v_table  text := 'topic_' || p_topic_id;
    v_seg    text := 'topic_' || p_topic_id || '_s' || p_segment;
    v_lo     bigint;
    v_hi     bigint;
    v_before bigint;
    v_after  bigint;
    v_expire timestamptz;
BEGIN
    SELECT s.lo, s.hi INTO v_lo, v_hi FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.segment = p_segment AND s.removing_at IS NULL;
    IF v_lo IS NULL OR to_regclass(format('%I.%I', '{schema_raw}', v_seg || '_c')) IS NULL THEN
        RETURN false;
    END IF;
    -- the topic table's lock (then the segment's and the copy's), each waited for p_lock_timeout_ms at most
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    BEGIN
        EXECUTE format('LOCK TABLE %I.%I, %I.%I, %I.%I IN ACCESS EXCLUSIVE MODE', '{schema_raw}', v_table,
                       '{schema_raw}', v_seg, '{schema_raw}', v_seg || '_c');
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', v_old, true);
        RETURN false;
    END;
    PERFORM set_config('lock_timeout', v_old, true);
    IF EXISTS (SELECT 1 FROM {schema}.segment_pins p
                WHERE p.topic_id = p_topic_id AND p.lo = v_lo AND p.until > clock_timestamp()) THEN
        RETURN false;  -- a reader pinned it meanwhile: the copy waits (and is made again) for a later pass
    END IF;
    v_before := pg_total_relation_size(format('%I.%I', '{schema_raw}', v_seg)::regclass);
    v_after := pg_total_relation_size(format('%I.%I', '{schema_raw}', v_seg || '_c')::regclass);
    EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I', '{schema_raw}', v_table, '{schema_raw}', v_seg);
    EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', '{schema_raw}', v_seg, v_seg || '_x');
    EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', '{schema_raw}', v_seg || '_c', v_seg);
    EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
                   '{schema_raw}', v_table, '{schema_raw}', v_seg, v_lo, v_hi);
    -- the segment's figures, as sealing records them; the events removed per partition are counted
    WITH old AS (
        DELETE FROM {schema}.segment_partitions WHERE topic_id = p_topic_id AND segment = p_segment
        RETURNING partition, events)
    INSERT INTO {schema}.partition_compaction AS c (topic_id, partition, events_removed)
    SELECT p_topic_id, old.partition, old.events FROM old
    ON CONFLICT (topic_id, partition) DO UPDATE SET events_removed = c.events_removed + excluded.events_removed;
    EXECUTE format(
        'INSERT INTO %1$I.segment_partitions (topic_id, segment, partition, lo, hi, events, first_position,'
        '                                     last_position, newest_at, bucket_width, buckets, bucket_events)'
        ' SELECT $1, $2, b.partition, $3, $4, sum(b.n), min(b.first), max(b.last), max(b.newest), $5,'
        '        array_agg(b.bucket ORDER BY b.bucket), array_agg(b.n ORDER BY b.bucket)'
        '   FROM (SELECT e.partition, e.position / $5 AS bucket, count(*) AS n, min(e.position) AS first,'
        '                max(e.position) AS last, max(e.created_at) AS newest'
        '           FROM %1$I.%2$I e GROUP BY 1, 2) b'
        '  GROUP BY b.partition',
        '{schema_raw}', v_seg)
      USING p_topic_id, p_segment, v_lo, v_hi, {schema}.bucket_width(v_lo, v_hi);
    UPDATE {schema}.partition_compaction c SET events_removed = c.events_removed - sp.events
      FROM {schema}.segment_partitions sp
     WHERE sp.topic_id = p_topic_id AND sp.segment = p_segment AND c.topic_id = p_topic_id
       AND c.partition = sp.partition;
    -- the removed tombstones' keys are gone from the topic (no older event of theirs remains)
    IF p_tombstones > 0 THEN
        EXECUTE format(
            'DELETE FROM %1$I.compaction_keys k'
            ' WHERE k.topic_id = $1 AND k.position >= $2 AND k.position < $3'
            '   AND NOT EXISTS (SELECT 1 FROM %1$I.%2$I e WHERE e.partition = k.partition AND e.position = k.position)',
            '{schema_raw}', v_seg)
          USING p_topic_id, v_lo, v_hi;
    END IF;
    EXECUTE format(
        'SELECT min(e.created_at) FROM %1$I.%2$I e JOIN %1$I.compaction_keys k'
        '    ON k.topic_id = $1 AND k.partition = e.partition AND k.key = e.key AND k.position = e.position'
        ' WHERE e.value IS NULL', '{schema_raw}', v_seg)
      INTO v_expire USING p_topic_id;
    UPDATE {schema}.segments s
       SET events = coalesce((SELECT sum(sp.events) FROM {schema}.segment_partitions sp
                               WHERE sp.topic_id = p_topic_id AND sp.segment = p_segment), 0),
           newest_at = coalesce((SELECT max(sp.newest_at) FROM {schema}.segment_partitions sp
                                  WHERE sp.topic_id = p_topic_id AND sp.segment = p_segment), s.newest_at),
           superseded = 0, tombstone_at = v_expire, compacted_at = now()
     WHERE s.topic_id = p_topic_id AND s.segment = p_segment;
    INSERT INTO {schema}.topic_compaction AS c (topic_id, ran_at, compacted_at, segments_rewritten, events_removed,
                                                tombstones_removed, bytes_removed)
    VALUES (p_topic_id, now(), now(), 1, p_removed, p_tombstones, greatest(v_before - v_after, 0))
    ON CONFLICT (topic_id) DO UPDATE
       SET ran_at = now(), compacted_at = now(), segments_rewritten = c.segments_rewritten + 1,
           events_removed = c.events_removed + excluded.events_removed,
           tombstones_removed = c.tombstones_removed + excluded.tombstones_removed,
           bytes_removed = c.bytes_removed + excluded.bytes_removed;
    RETURN true;
END;
$$;

-- Record that compaction looked at a topic (whether or not it rewrote anything).
CREATE FUNCTION {schema}.compaction_ran(p_topic_id integer) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO {schema}.topic_compaction AS c (topic_id, ran_at) VALUES (p_topic_id, now())
    ON CONFLICT (topic_id) DO UPDATE SET ran_at = now();
$$;

-- One topic's compaction in the caller's transaction (the path of maintain(), which pg_cron runs): map,
-- then rewrite the planned segments while the call is younger than p_budget; returns the events removed.
CREATE FUNCTION {schema}.compact_topic(p_topic_id integer, p_lock_timeout_ms integer, p_budget interval)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_start   timestamptz := clock_timestamp();
    v_removed bigint := 0;
    b         record;
    p         record;
BEGIN
    PERFORM {schema}.compaction_leftovers(p_topic_id);
    PERFORM {schema}.compaction_map(p_topic_id);
    FOR p IN SELECT * FROM {schema}.compaction_plan(p_topic_id, now()) LOOP
        EXIT WHEN clock_timestamp() - v_start > p_budget;
        SELECT * INTO b FROM {schema}.compact_build(p_topic_id, p.segment, now());
        IF b.removed > 0 AND {schema}.compact_swap(p_topic_id, p.segment, b.removed, b.tombstones,
                                                   p_lock_timeout_ms) THEN
            v_removed := v_removed + b.removed;
        END IF;
    END LOOP;
    PERFORM {schema}.compaction_leftovers(p_topic_id);  -- the replaced segments (their files go at commit)
    PERFORM {schema}.compaction_ran(p_topic_id);
    RETURN v_removed;
END;
$$;

-- Retention applies with cleanup.policy delete and compact,delete.
CREATE OR REPLACE FUNCTION {schema}.retention_plan(p_topic_id integer, p_now timestamptz)
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
    IF v_config IS NULL OR NOT {schema}.deletes(v_config) THEN
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

-- A compacted topic with segments to map or to rewrite some day is checked at every pass (compaction
-- depends on the time: lags and tombstones come due); retention by age applies to compact,delete too.
CREATE OR REPLACE FUNCTION {schema}.topic_checked(p_topic_id integer, p_position bigint, p_config jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ms      bigint := {schema}.topic_limit(p_config, 'retention.ms');
    v_due     timestamptz;
    v_settled boolean;
BEGIN
    IF v_ms IS NOT NULL AND {schema}.deletes(p_config) THEN
        SELECT coalesce(s.newest_at, '-infinity') + v_ms * interval '1 millisecond' INTO v_due
          FROM {schema}.segments s
         WHERE s.topic_id = p_topic_id AND s.sealed_at IS NOT NULL AND s.removing_at IS NULL
         ORDER BY s.segment LIMIT 1;
    END IF;
    IF {schema}.compacts(p_config) AND EXISTS (
           SELECT 1 FROM {schema}.segments s
            WHERE s.topic_id = p_topic_id AND s.removing_at IS NULL AND s.sealed_at IS NOT NULL
              AND (s.mapped_at IS NULL OR s.superseded > 0 OR s.tombstone_at IS NOT NULL)) THEN
        v_due := now();
    END IF;
    v_settled := NOT EXISTS (
        SELECT 1 FROM {schema}.segments s
         WHERE s.topic_id = p_topic_id
           AND ((s.sealed_at IS NULL AND s.hi <= p_position + 1)
                OR (s.removing_at IS NOT NULL AND s.detached_at IS NULL)));
    INSERT INTO {schema}.topic_retention AS t (topic_id, ran_at, checked_position, checked_config, settled, due_at)
    VALUES (p_topic_id, now(), p_position, p_config, v_settled, v_due)
    ON CONFLICT (topic_id) DO UPDATE
       SET ran_at = now(), checked_position = excluded.checked_position,
           checked_config = excluded.checked_config, settled = excluded.settled, due_at = excluded.due_at;
END;
$$;

-- maintain() (what pg_cron runs) compacts too: after retention, each compacted topic's segments are mapped
-- and rewritten while the call is younger than 10 seconds (the rest waits for the next call).
CREATE OR REPLACE FUNCTION {schema}.maintain(p_lock_timeout_ms integer DEFAULT 100) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_start     timestamptz := clock_timestamp();
    v_created   integer := 0;
    v_sealed    integer := 0;
    v_removed   integer := 0;
    v_events    bigint := 0;
    v_compacted bigint := 0;
    v_expired   integer;
    v_checked   integer := 0;
    v_segs      bigint[];
    v_ev        bigint;
    v_by        bigint;
    v_summary   jsonb;
    t           record;
    s           record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pgstreams.maintain'), hashtext('{schema_raw}')) THEN
        RETURN jsonb_build_object('skipped', true);
    END IF;
    FOR s IN SELECT d.topic_id, d.segment FROM {schema}.detached_segments() d LOOP
        IF {schema}.drop_segment(s.topic_id, s.segment, p_lock_timeout_ms) THEN
            v_removed := v_removed + 1;
        END IF;
    END LOOP;
    FOR t IN SELECT m.topic_id AS id, m.last_position, m.config FROM {schema}.maintenance_topics() m LOOP
        v_checked := v_checked + 1;
        v_created := v_created + {schema}.prepare_segments(t.id);
        v_sealed := v_sealed + {schema}.seal_segments(t.id);
        SELECT array_agg(p.segment ORDER BY p.segment), coalesce(sum(p.events), 0), coalesce(sum(p.bytes), 0)
          INTO v_segs, v_ev, v_by FROM {schema}.retention_plan(t.id, now()) p;
        IF v_segs IS NOT NULL THEN
            PERFORM {schema}.mark_removing(t.id, v_segs, v_ev, v_by);
            v_events := v_events + v_ev;
        END IF;
        FOR s IN SELECT segment FROM {schema}.segments
                  WHERE topic_id = t.id AND removing_at IS NOT NULL ORDER BY segment LOOP
            IF {schema}.drop_segment(t.id, s.segment, p_lock_timeout_ms) THEN
                v_removed := v_removed + 1;
            END IF;
        END LOOP;
        IF {schema}.compacts(t.config) THEN
            v_compacted := v_compacted + {schema}.compact_topic(
                t.id, p_lock_timeout_ms, greatest(interval '0', interval '10 seconds' - (clock_timestamp() - v_start)));
        END IF;
        PERFORM {schema}.topic_checked(t.id, t.last_position, t.config);
    END LOOP;
    v_expired := {schema}.expire_members();
    v_summary := jsonb_build_object(
        'segments_created', v_created, 'segments_sealed', v_sealed, 'segments_removed', v_removed,
        'events_removed', v_events, 'members_expired', v_expired, 'topics_checked', v_checked,
        'events_compacted', v_compacted);
    UPDATE {schema}.maintenance
       SET ran_at = now(), duration_ms = extract(epoch FROM clock_timestamp() - v_start) * 1000,
           runner = 'sql', summary = v_summary;
    RETURN v_summary;
END;
$$;

-- The dirty ratio of a compacted topic: the share of its mapped events that a newer event of their key
-- superseded (NULL without mapped events).
CREATE FUNCTION {schema}.dirty_ratio(p_topic_id integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT sum(s.superseded)::double precision / nullif(sum(s.events), 0)
      FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.mapped_at IS NOT NULL AND s.removing_at IS NULL;
$$;

-- retention_status with compaction's figures.
CREATE OR REPLACE VIEW {schema}.retention_status AS
SELECT t.name AS topic, t.id AS topic_id,
       coalesce(t.config ->> 'cleanup.policy', 'delete') AS cleanup_policy,
       {schema}.topic_limit(t.config, 'retention.ms') AS retention_ms,
       {schema}.topic_limit(t.config, 'retention.events') AS retention_events,
       {schema}.topic_limit(t.config, 'retention.bytes') AS retention_bytes,
       o.position AS oldest_position, o.created_at AS oldest_at,
       (SELECT coalesce(sum(pg_total_relation_size(pt.relid)), 0)
          FROM pg_partition_tree(format('%I.%I', '{schema_raw}', 'topic_' || t.id)::regclass) pt) AS bytes,
       (SELECT count(*) FROM {schema}.segments s WHERE s.topic_id = t.id AND s.removing_at IS NULL) AS segments,
       CASE WHEN r.topic_id IS NOT NULL
            THEN greatest(r.ran_at, (SELECT m.ran_at FROM {schema}.maintenance m)) END AS retention_ran_at,
       coalesce(r.segments_removed, 0) AS segments_removed,
       coalesce(r.events_removed, 0) AS events_removed,
       coalesce(r.bytes_removed, 0) AS bytes_removed,
       {schema}.dirty_ratio(t.id) AS dirty_ratio,
       c.compacted_at AS compacted_at,
       coalesce(c.segments_rewritten, 0) AS segments_compacted,
       coalesce(c.events_removed, 0) AS events_compacted,
       coalesce(c.tombstones_removed, 0) AS tombstones_removed,
       coalesce(c.bytes_removed, 0) AS bytes_compacted
  FROM {schema}.topics t
  LEFT JOIN {schema}.topic_retention r ON r.topic_id = t.id
  LEFT JOIN {schema}.topic_compaction c ON c.topic_id = t.id
 CROSS JOIN LATERAL {schema}.oldest_event(t.id) o;

-- The SQL publish(): a NULL value with a key is a tombstone (without a key it is refused, as before); a
-- compacted topic refuses an event without a key (null_value_not_allowed) and stores nothing.
CREATE OR REPLACE FUNCTION {schema}.publish_encoded(
    p_topic text, p_kind "char", p_payload bytea, p_key text, p_headers jsonb, p_event_type text,
    p_partition integer, p_event_id text, p_correlation_id text, p_causation_id text, p_notify boolean
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    v_id      integer;
    v_parts   integer;
    v_size    bigint;
    v_max     bigint;
    v_compact boolean;
    v_bytes   bigint;
    v_bad     record;
    v_headers jsonb := p_headers;
    v_rr      text;
    v_seq     regclass;
    v_end     bigint;
    v_off     bigint;
    r         {schema}.publish_result;
BEGIN
    -- the topic
    IF p_topic IS NULL THEN
        RAISE EXCEPTION 'topic name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_topic !~ '^[A-Za-z0-9._-]{{1,249}}$' OR p_topic IN ('.', '..') THEN
        RAISE EXCEPTION 'invalid topic name %: use 1 to 249 characters of [A-Za-z0-9._-]', quote_literal(p_topic)
            USING ERRCODE = 'invalid_name';
    END IF;
    SELECT t.id, t.partitions, t.segment_size, {schema}.max_message_bytes(t.config), {schema}.compacts(t.config)
      INTO v_id, v_parts, v_size, v_max, v_compact
      FROM {schema}.topics t WHERE t.name = p_topic;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'topic % does not exist', quote_literal(p_topic) USING ERRCODE = 'no_data_found';
    END IF;
    -- the event
    IF p_key IS NULL AND v_compact THEN
        RAISE EXCEPTION 'topic % is compacted (cleanup.policy %): every event needs a key; nothing was stored',
                        quote_literal(p_topic), (SELECT t.config ->> 'cleanup.policy' FROM {schema}.topics t WHERE t.id = v_id)
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_payload IS NULL THEN
        IF p_key IS NULL THEN
            RAISE EXCEPTION 'value must not be NULL without a key (a tombstone has a key; a JSON null is ''null''::jsonb)'
                USING ERRCODE = 'null_value_not_allowed';
        END IF;
        p_kind := 'b';  -- a tombstone: no value (stored as NULL, read as None)
    END IF;
    IF v_headers IS NOT NULL THEN
        IF jsonb_typeof(v_headers) = 'null' THEN
            v_headers := NULL;
        ELSIF jsonb_typeof(v_headers) <> 'object' THEN
            RAISE EXCEPTION 'headers must be a JSON object of string values, not a JSON %', jsonb_typeof(v_headers)
                USING ERRCODE = 'invalid_parameter_value';
        ELSE
            SELECT h.key, h.value INTO v_bad FROM jsonb_each(v_headers) h
             WHERE jsonb_typeof(h.value) <> 'string' LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'headers must map strings to strings; bad entry %: % (a JSON %)',
                                to_jsonb(v_bad.key), v_bad.value, jsonb_typeof(v_bad.value)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF v_headers = '{{}}'::jsonb THEN
                v_headers := NULL;  -- as the Python producer stores no headers
            END IF;
        END IF;
    END IF;
    IF coalesce(p_event_type, p_event_id, p_correlation_id, p_causation_id) IS NOT NULL THEN
        SELECT f.name, char_length(f.text) AS length INTO v_bad
          FROM (VALUES (1, 'event_type', p_event_type), (2, 'event_id', p_event_id),
                       (3, 'correlation_id', p_correlation_id), (4, 'causation_id', p_causation_id))
               AS f(i, name, text)
         WHERE char_length(f.text) NOT BETWEEN 1 AND 1000
         ORDER BY f.i LIMIT 1;
        IF FOUND THEN  -- as the Python producer: 1 to 1000 characters
            RAISE EXCEPTION '% must have 1 to 1000 characters, got %', v_bad.name, v_bad.length
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- the size max.message.bytes limits: value as stored, key, header names and values (UTF-8 bytes)
    v_bytes := coalesce(octet_length(p_payload), 0) + coalesce(octet_length(p_key), 0);
    IF v_headers IS NOT NULL THEN
        v_bytes := v_bytes + (SELECT coalesce(sum(octet_length(h.key) + octet_length(h.value)), 0)
                                FROM jsonb_each_text(v_headers) h);
    END IF;
    IF v_bytes > v_max THEN
        RAISE EXCEPTION 'event of % bytes exceeds max.message.bytes (%) of topic %; nothing was stored',
                        v_bytes, v_max, quote_literal(p_topic)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF p_notify IS NULL THEN
        RAISE EXCEPTION 'notify must be true or false, not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- the partition: given, else the key's, else round-robin per session and topic from a random start
    IF p_partition IS NOT NULL THEN
        IF p_partition < 0 OR p_partition >= v_parts THEN
            RAISE EXCEPTION 'partition % out of range for topic % (0 to %)', p_partition,
                            quote_literal(p_topic), v_parts - 1
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        r.partition := p_partition;
    ELSIF p_key IS NOT NULL THEN
        r.partition := {schema}.partition_for_key(p_key, v_parts);
    ELSE
        v_rr := nullif(current_setting('pgstreams.round_robin_' || v_id, true), '');
        r.partition := coalesce(v_rr::integer + 1, floor(random() * v_parts)::integer) % v_parts;
        PERFORM set_config('pgstreams.round_robin_' || v_id, r.partition::text, false);
    END IF;
    -- the position (registering the transaction with the partition's read fence first)
    v_seq := format('%I.%I', '{schema_raw}', 'topic_' || v_id || '_seq')::regclass;
    r.position := {schema}.next_position(v_id, r.partition, v_seq);
    r.duplicate := false;
    IF p_event_id IS NOT NULL THEN
        INSERT INTO {schema}.event_ids (topic_id, event_id, partition, position)
        VALUES (v_id, p_event_id, r.partition, r.position)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT i.partition, i.position INTO r.partition, r.position
              FROM {schema}.event_ids i WHERE i.topic_id = v_id AND i.event_id = p_event_id;
            IF NOT FOUND THEN  -- the conflicting row vanished: the topic was deleted meanwhile
                RAISE EXCEPTION 'topic % changed while publishing', quote_literal(p_topic)
                    USING ERRCODE = 'no_data_found';
            END IF;
            r.duplicate := true;
            RETURN r;
        END IF;
    END IF;
    -- the segment holding the position, and one ahead
    SELECT s.hi INTO v_end FROM {schema}.segments s WHERE s.topic_id = v_id ORDER BY s.segment DESC LIMIT 1;
    IF r.position >= coalesce(v_end, 0) THEN
        PERFORM {schema}.ensure_segments(v_id, r.position + v_size);
    ELSIF r.position + v_size >= v_end THEN
        IF pg_try_advisory_xact_lock(hashtext('pgstreams.segments'), v_id) THEN  -- ensure_segments' lock
            PERFORM {schema}.ensure_segments(v_id, r.position + v_size);
        END IF;
    END IF;
    EXECUTE format('INSERT INTO %I.%I (partition, position, kind, key, value, headers, event_type, event_id,'
                   ' correlation_id, causation_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)',
                   '{schema_raw}', 'topic_' || v_id)
      USING r.partition, r.position, p_kind, p_key, p_payload, v_headers, p_event_type, p_event_id,
            p_correlation_id, p_causation_id;
    -- column statistics of a new segment once it holds enough rows (see analyze_segment), tried at
    -- every 512th position
    v_off := r.position % v_size;
    IF v_off % 512 = 0 AND v_off >= least(1000, v_size / 2) THEN
        PERFORM {schema}.analyze_segment(v_id, r.position);
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('pgstreams.{schema_raw}', v_id::text);
    END IF;
    RETURN r;
END;
$$;
