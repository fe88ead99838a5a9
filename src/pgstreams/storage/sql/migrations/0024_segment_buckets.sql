-- Lag and counts without counting the segment that holds a checkpoint.
--
-- partition_progress() (0008) took a sealed segment's figures from segment_partitions, except for the
-- segment holding the checkpoint, whose events after it were counted row by row: a describe of a group
-- whose checkpoint sits in a segment of 1,000,000 events counted up to 1,000,000 rows, and
-- describe_topic() (the lag of position 0) counted the whole oldest segment.
--
-- Sealing now records, per segment and partition, how many events fall in each bucket of positions
-- (BUCKETS buckets of width ceil((hi - lo) / BUCKETS), found in the same single scan as the other
-- figures: one hash aggregate by partition and bucket, no sort). The events of a sealed segment after a
-- checkpoint are then the events of the buckets after the checkpoint's bucket (from the arrays) plus
-- those of its own bucket after it (an index range of at most one bucket's width: about 1,000 rows for
-- a segment of 1,000,000 positions). Segments sealed before this migration have no buckets: theirs are
-- still counted.
--
-- The segment holding a checkpoint is found in the segments table (not from positions / segment_size:
-- segment.events can change after a topic's first segments were created).
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.segment_partitions
    ADD COLUMN bucket_width  bigint,
    ADD COLUMN buckets       bigint[],
    ADD COLUMN bucket_events bigint[];

-- The width of the position buckets of a segment covering [p_lo, p_hi): 1,024 buckets at most.
CREATE FUNCTION {schema}.bucket_width(p_lo bigint, p_hi bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(1, (p_hi - p_lo + 1023) / 1024);
$$;

-- Seal the segments of a topic that every partition's read fence has passed: record their figures per
-- partition, with the events per bucket of positions (one scan of each, once in its life). Oldest
-- first; returns how many were sealed.
CREATE OR REPLACE FUNCTION {schema}.seal_segments(p_topic_id integer) RETURNS integer
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
            '                                     last_position, newest_at, bucket_width, buckets, bucket_events)'
            ' SELECT $1, $2, b.partition, $3, $4, sum(b.n), min(b.first), max(b.last), max(b.newest), $5,'
            '        array_agg(b.bucket ORDER BY b.bucket), array_agg(b.n ORDER BY b.bucket)'
            '   FROM (SELECT e.partition, e.position / $5 AS bucket, count(*) AS n, min(e.position) AS first,'
            '                max(e.position) AS last, max(e.created_at) AS newest'
            '           FROM %1$I.%2$I e GROUP BY 1, 2) b'
            '  GROUP BY b.partition'
            ' ON CONFLICT DO NOTHING',
            '{schema_raw}', 'topic_' || p_topic_id || '_s' || r.segment)
          USING p_topic_id, r.segment, r.lo, r.hi, {schema}.bucket_width(r.lo, r.hi);
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

-- Head and lag of one partition after a checkpoint without scanning the log: the segment holding the
-- checkpoint, once sealed, counts from its buckets (and at most one bucket's rows); sealed segments
-- after it from their statistics; only the unsealed segments (the last one or two) are counted row by row.
CREATE OR REPLACE FUNCTION {schema}.partition_progress(
    p_topic_id integer, p_partition integer, p_position bigint, OUT head bigint, OUT lag bigint
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_sealed bigint;
    v_seg    bigint;
    v_end    bigint;
    v_in     bigint := 0;
    v_stats  bigint;
    v_tail   bigint;
    v_bucket bigint;
    sp       record;
BEGIN
    SELECT coalesce(max(s.hi), 0) INTO v_sealed FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.sealed_at IS NOT NULL;
    SELECT s.segment, s.hi INTO v_seg, v_end FROM {schema}.segments s
     WHERE s.topic_id = p_topic_id AND s.lo <= p_position AND s.hi > p_position;
    IF NOT FOUND THEN  -- before the retained segments: their events are gone
        v_end := p_position + 1;
    END IF;
    IF v_end > v_sealed THEN  -- the checkpoint is in an unsealed segment (or after): count what follows
        EXECUTE format(
            'SELECT (SELECT e.position FROM %1$I.%2$I e WHERE e.partition = $1 ORDER BY e.position DESC LIMIT 1),'
            '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND e.position > $2)',
            '{schema_raw}', 'topic_' || p_topic_id)
          INTO head, lag USING p_partition, p_position;
        RETURN;
    END IF;
    IF v_seg IS NOT NULL THEN
        SELECT x.events, x.first_position, x.last_position, x.removed_at, x.bucket_width, x.buckets,
               x.bucket_events
          INTO sp FROM {schema}.segment_partitions x
         WHERE x.topic_id = p_topic_id AND x.segment = v_seg AND x.partition = p_partition;
        IF NOT FOUND OR sp.removed_at IS NOT NULL OR sp.last_position <= p_position THEN
            v_in := 0;
        ELSIF sp.first_position > p_position THEN
            v_in := sp.events;
        ELSIF sp.bucket_width IS NULL THEN  -- sealed before its buckets were recorded
            EXECUTE format('SELECT count(*) FROM %1$I.%2$I e'
                           ' WHERE e.partition = $1 AND e.position > $2 AND e.position < $3',
                           '{schema_raw}', 'topic_' || p_topic_id || '_s' || v_seg)
              INTO v_in USING p_partition, p_position, v_end;
        ELSE
            v_bucket := p_position / sp.bucket_width;
            SELECT coalesce(sum(u.n), 0) INTO v_in
              FROM unnest(sp.buckets, sp.bucket_events) AS u(b, n) WHERE u.b > v_bucket;
            EXECUTE format('SELECT count(*) FROM %1$I.%2$I e'
                           ' WHERE e.partition = $1 AND e.position > $2 AND e.position < $3',
                           '{schema_raw}', 'topic_' || p_topic_id || '_s' || v_seg)
              INTO v_tail USING p_partition, p_position, least((v_bucket + 1) * sp.bucket_width, v_end);
            v_in := v_in + v_tail;
        END IF;
    END IF;
    SELECT coalesce(sum(x.events), 0) INTO v_stats FROM {schema}.segment_partitions x
     WHERE x.topic_id = p_topic_id AND x.partition = p_partition AND x.removed_at IS NULL
       AND x.lo >= v_end AND x.hi <= v_sealed;
    EXECUTE format(
        'SELECT (SELECT e.position FROM %1$I.%2$I e WHERE e.partition = $1 ORDER BY e.position DESC LIMIT 1),'
        '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND e.position >= $2)',
        '{schema_raw}', 'topic_' || p_topic_id)
      INTO head, v_tail USING p_partition, v_sealed;
    lag := v_in + v_stats + v_tail;
END;
$$;
