-- Segments without a CHECK constraint of their own.
--
-- ensure_segments() gave every segment a CHECK (position >= lo AND position < hi) before attaching it,
-- the usual way to spare ATTACH PARTITION its validating scan. A new segment is empty, so that scan costs
-- nothing, while the constraint cost every insert: the executor checks a leaf's CHECK constraints on
-- every row it routes there, and a single-row INSERT parses the constraint's stored expression again at
-- each execution (a prepared statement's executor state lives for one execution). That was a tenth of the
-- server's instructions of an autocommit single publish. The partition bounds keep every row in its
-- segment exactly as before: a position beyond the last segment still fails with check_violation ("no
-- partition of relation ... found for row"), which publishers answer by adding segments.
--
-- Existing segments lose the constraint here (ALTER TABLE ... DROP CONSTRAINT takes a short ACCESS
-- EXCLUSIVE lock on each segment, once). Rendered with the target schema as {schema} / '{schema_raw}';
-- literal braces are doubled.

CREATE OR REPLACE FUNCTION {schema}.ensure_segments(p_topic_id integer, p_upto bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
        EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
                       '{schema_raw}', v_table, '{schema_raw}', v_child, v_seg * v_size, (v_seg + 1) * v_size);
        INSERT INTO {schema}.segments (topic_id, segment, lo, hi)
        VALUES (p_topic_id, v_seg, v_seg * v_size, (v_seg + 1) * v_size);
        v_seg := v_seg + 1;
    END LOOP;
    RETURN (SELECT max(hi) FROM {schema}.segments WHERE topic_id = p_topic_id);
END;
$$;

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT n.nspname, c.relname, k.conname
          FROM pg_constraint k
          JOIN pg_class c ON c.oid = k.conrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = '{schema_raw}' AND k.contype = 'c'
           AND c.relname ~ '^topic_[0-9]+_s[0-9]+$' AND k.conname = c.relname || '_range'
    LOOP
        EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', r.nspname, r.relname, r.conname);
    END LOOP;
END;
$$;
