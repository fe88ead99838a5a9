-- Maintenance that costs O(topics with work) and retention that frees disk space after the pass.
--
-- Skipping topics with nothing to do. A maintenance pass checks a topic (segments ahead, statistics,
-- sealing, retention) and records what it saw in topic_retention: the topic's last drawn position
-- (checked_position), its configuration (checked_config), whether everything below that position is
-- sealed and nothing is left to detach (settled), and the next time retention by age may remove a segment
-- (due_at, from the oldest retained segment's newest event). maintenance_topics() lists only the topics
-- whose state moved since: new events, another configuration, unsettled, retention due, or never checked.
-- An idle topic costs one sequence read per pass.
--
-- Freeing space after the pass. Removing a segment was: mark, DETACH, DROP. DROP deletes the segment's
-- files, which costs what the file system needs to free them (far more than the catalog changes: on a file
-- system that discards freed blocks, about 40 ms per 100 MB). Retention now detaches the segments in the
-- pass (their events are gone from the topic at once) and records segments.detached_at; dropping the
-- detached tables ("purging") is a step after the pass, outside its lock, which blocks nobody (a detached
-- table is no longer part of the topic), as Kafka deletes a removed segment's files after a delay.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.segments ADD COLUMN detached_at timestamptz;

ALTER TABLE {schema}.topic_retention
    ADD COLUMN checked_position bigint,
    ADD COLUMN checked_config   jsonb,
    ADD COLUMN settled          boolean NOT NULL DEFAULT false,
    ADD COLUMN due_at           timestamptz;

CREATE INDEX segments_detached_idx ON {schema}.segments (topic_id, segment) WHERE detached_at IS NOT NULL;

-- The topics a maintenance pass must check (see above), with their last drawn position (read before the
-- check: events drawn later are seen by the next pass) and configuration.
CREATE FUNCTION {schema}.maintenance_topics()
RETURNS TABLE (topic_id integer, last_position bigint, config jsonb)
LANGUAGE sql STABLE AS $$
    SELECT t.id, v.last, t.config
      FROM {schema}.topics t
      LEFT JOIN {schema}.topic_retention r ON r.topic_id = t.id
     CROSS JOIN LATERAL (
           SELECT coalesce(pg_sequence_last_value(
                      to_regclass(format('%I.%I', '{schema_raw}', 'topic_' || t.id || '_seq'))), 0) AS last) v
     WHERE r.topic_id IS NULL OR NOT r.settled OR r.checked_position IS DISTINCT FROM v.last
        OR r.checked_config IS DISTINCT FROM t.config OR r.due_at <= now()
     ORDER BY t.id;
$$;

-- Record that a pass checked a topic whose last drawn position was p_position and configuration p_config
-- when the check began (what maintenance_topics() compares with).
CREATE FUNCTION {schema}.topic_checked(p_topic_id integer, p_position bigint, p_config jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ms      bigint := {schema}.topic_limit(p_config, 'retention.ms');
    v_due     timestamptz;
    v_settled boolean;
BEGIN
    IF v_ms IS NOT NULL AND coalesce(p_config ->> 'cleanup.policy', 'delete') = 'delete' THEN
        SELECT coalesce(s.newest_at, '-infinity') + v_ms * interval '1 millisecond' INTO v_due
          FROM {schema}.segments s
         WHERE s.topic_id = p_topic_id AND s.sealed_at IS NOT NULL AND s.removing_at IS NULL
         ORDER BY s.segment LIMIT 1;
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

-- The detached segments left to drop, oldest first (every topic's).
CREATE FUNCTION {schema}.detached_segments() RETURNS TABLE (topic_id integer, segment bigint)
LANGUAGE sql STABLE AS $$
    SELECT s.topic_id, s.segment FROM {schema}.segments s WHERE s.detached_at IS NOT NULL
     ORDER BY s.detached_at, s.topic_id, s.segment;
$$;

-- maintain() (what pg_cron runs) checks only the topics maintenance_topics() lists.
CREATE OR REPLACE FUNCTION {schema}.maintain(p_lock_timeout_ms integer DEFAULT 100) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_start   timestamptz := clock_timestamp();
    v_created integer := 0;
    v_sealed  integer := 0;
    v_removed integer := 0;
    v_events  bigint := 0;
    v_expired integer;
    v_checked integer := 0;
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
    -- segments detached by pgstreams' own passes and not dropped yet
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
        PERFORM {schema}.topic_checked(t.id, t.last_position, t.config);
    END LOOP;
    v_expired := {schema}.expire_members();
    v_summary := jsonb_build_object(
        'segments_created', v_created, 'segments_sealed', v_sealed, 'segments_removed', v_removed,
        'events_removed', v_events, 'members_expired', v_expired, 'topics_checked', v_checked);
    UPDATE {schema}.maintenance
       SET ran_at = now(), duration_ms = extract(epoch FROM clock_timestamp() - v_start) * 1000,
           runner = 'sql', summary = v_summary;
    RETURN v_summary;
END;
$$;

-- Retention "ran" on a topic that a pass skipped too (nothing could be removed): the view shows the later of
-- the topic's last check and the schema's last pass, once the topic was checked at all.
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
       coalesce(r.bytes_removed, 0) AS bytes_removed
  FROM {schema}.topics t
  LEFT JOIN {schema}.topic_retention r ON r.topic_id = t.id
 CROSS JOIN LATERAL {schema}.oldest_event(t.id) o;
