-- Held snapshots: the rows updated most often are found at once, whatever their dead versions.
--
-- While a snapshot holds the xmin horizon back (a long REPEATABLE READ transaction, a replication slot with
-- hot_standby_feedback, a forgotten idle-in-transaction session), VACUUM and page pruning may remove no
-- version of a row newer than it: every update of a checkpoint (one per commit and partition moved) or
-- of a SQL producer's state (one per publish) leaves one more. A lookup by key reads them all: the index
-- has an entry per version that left its page, and each leads to the chain of versions kept on that page,
-- walked from the oldest. After 10 minutes of commits, storing a checkpoint read tens of thousands of row
-- versions (a millisecond and more per partition, growing with the hold).
--
-- Each session now remembers where it left the current version of the rows it updated (its ctid, in a
-- session setting named after the row: pgstreams.ck_<md5> / pgstreams.pr_<md5>) and looks there first,
-- by tid: one tuple read. The hint is only a hint: the row found there must have the key and be visible
-- (a newer version committed by another session makes it invisible; a version updated while this one
-- waits for its lock is re-checked against the tid and dropped), else the lookup by key runs as before.
-- A setting made in a transaction that rolls back is undone with it.
--
-- A SQL producer's publish updates its row once instead of twice (the sequence, the partition and the
-- position together, after the event is stored): one dead version per publish under a held snapshot.
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

-- The session setting that remembers a row's ctid: its name (a valid custom setting name for any key).
CREATE FUNCTION {schema}.row_hint(p_kind text, p_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgstreams.' || p_kind || '_' || md5('{schema_raw}/' || p_key);
$$;

CREATE OR REPLACE FUNCTION {schema}.store_checkpoint(
    p_group text, p_topic_id integer, p_partition integer, p_position bigint, p_expected_position bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_hint text := {schema}.row_hint('ck', p_group || '/' || p_topic_id || '/' || p_partition);
    v_at   text := current_setting(v_hint, true);
    v_tid  tid;
    v_pos  bigint;
BEGIN
    IF v_at <> '' THEN
        SELECT position, ctid INTO v_pos, v_tid FROM {schema}.checkpoints
         WHERE ctid = v_at::tid AND group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
           FOR UPDATE;
    END IF;
    IF v_tid IS NULL THEN
        SELECT position, ctid INTO v_pos, v_tid FROM {schema}.checkpoints
         WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
           FOR UPDATE;
    END IF;
    IF v_tid IS NULL THEN
        INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, position)
        VALUES (p_group, p_topic_id, p_partition, p_position)
        ON CONFLICT DO NOTHING
        RETURNING ctid INTO v_tid;
        IF v_tid IS NOT NULL THEN
            PERFORM set_config(v_hint, v_tid::text, false);
            RETURN 1;
        END IF;
        SELECT position, ctid INTO v_pos, v_tid FROM {schema}.checkpoints
         WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
           FOR UPDATE;
    END IF;
    IF v_pos = p_position THEN
        PERFORM set_config(v_hint, v_tid::text, false);
        RETURN 0;
    ELSIF v_pos = p_expected_position THEN
        IF p_position < v_pos THEN
            RETURN 0;
        END IF;
        UPDATE {schema}.checkpoints SET position = p_position, updated_at = now()
         WHERE ctid = v_tid AND group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
        RETURNING ctid INTO v_tid;
        IF NOT FOUND THEN  -- not expected: the row is locked by this transaction
            UPDATE {schema}.checkpoints SET position = p_position, updated_at = now()
             WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
            RETURNING ctid INTO v_tid;
        END IF;
        PERFORM set_config(v_hint, v_tid::text, false);
        RETURN 1;
    ELSIF v_pos > p_expected_position THEN
        RETURN 2;
    ELSE
        RETURN 3;
    END IF;
END;
$$;

-- Lock producer p_producer's row (made by its first publish) and say whether p_sequence is new (NULL: the
-- caller stores the event, then producer_stored() records it) or a repeat (the duplicate's result,
-- partition and position known for the last sequence only). Writes nothing for a producer's later
-- publishes: producer_stored() is their one update.
CREATE OR REPLACE FUNCTION {schema}.producer_sequence(p_producer bigint, p_sequence bigint)
RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    v_hint text;
    v_at   text;
    v_tid  tid;
    v_seq  bigint;
    r      {schema}.publish_result;
BEGIN
    IF (p_producer IS NULL) <> (p_sequence IS NULL) THEN
        RAISE EXCEPTION 'producer and sequence go together: give both or neither'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_producer < 1 OR p_sequence < 0 THEN
        RAISE EXCEPTION 'producer must be at least 1 (new_producer_id()) and sequence at least 0, got % and %',
                        p_producer, p_sequence USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_hint := {schema}.row_hint('pr', p_producer::text);
    v_at := current_setting(v_hint, true);
    IF v_at <> '' THEN
        SELECT p.sequence, p.partition, p.position, p.ctid INTO v_seq, r.partition, r.position, v_tid
          FROM {schema}.producers p WHERE p.ctid = v_at::tid AND p.id = p_producer FOR UPDATE;
    END IF;
    IF v_tid IS NULL THEN
        SELECT p.sequence, p.partition, p.position, p.ctid INTO v_seq, r.partition, r.position, v_tid
          FROM {schema}.producers p WHERE p.id = p_producer FOR UPDATE;
    END IF;
    IF v_tid IS NULL THEN
        INSERT INTO {schema}.producers AS p (id, sequence, updated_at) VALUES (p_producer, p_sequence, now())
        ON CONFLICT (id) DO NOTHING
        RETURNING p.ctid INTO v_tid;
        IF v_tid IS NOT NULL THEN
            PERFORM set_config(v_hint, v_tid::text, false);
            RETURN NULL;
        END IF;
        SELECT p.sequence, p.partition, p.position, p.ctid INTO v_seq, r.partition, r.position, v_tid
          FROM {schema}.producers p WHERE p.id = p_producer FOR UPDATE;
    END IF;
    PERFORM set_config(v_hint, v_tid::text, false);
    IF v_seq < p_sequence THEN
        RETURN NULL;
    END IF;
    IF v_seq <> p_sequence THEN
        r.partition := NULL;
        r.position := NULL;
    END IF;
    r.duplicate := true;
    RETURN r;
END;
$$;

-- Record that producer p_producer stored sequence p_sequence at (p_topic, r): its one update per publish,
-- on the row producer_sequence() locked (found by the session's hint).
CREATE FUNCTION {schema}.producer_stored(p_producer bigint, p_sequence bigint, p_topic text,
                                         r {schema}.publish_result) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_hint  text := {schema}.row_hint('pr', p_producer::text);
    v_at    text := current_setting(v_hint, true);
    v_tid   tid;
    v_topic integer := (SELECT t.id FROM {schema}.topics t WHERE t.name = p_topic);
BEGIN
    IF v_at <> '' THEN
        UPDATE {schema}.producers p
           SET sequence = p_sequence, updated_at = now(), topic_id = v_topic, partition = r.partition,
               position = r.position
         WHERE p.ctid = v_at::tid AND p.id = p_producer
        RETURNING p.ctid INTO v_tid;
    END IF;
    IF v_tid IS NULL THEN
        UPDATE {schema}.producers p
           SET sequence = p_sequence, updated_at = now(), topic_id = v_topic, partition = r.partition,
               position = r.position
         WHERE p.id = p_producer
        RETURNING p.ctid INTO v_tid;
    END IF;
    PERFORM set_config(v_hint, v_tid::text, false);
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.publish_sequenced(
    p_topic text, p_kind "char", p_payload bytea, p_key text, p_headers jsonb, p_event_type text,
    p_partition integer, p_event_id text, p_correlation_id text, p_causation_id text, p_notify boolean,
    p_producer bigint, p_sequence bigint
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.publish_result;
BEGIN
    IF p_producer IS NULL AND p_sequence IS NULL THEN
        RETURN {schema}.publish_encoded(p_topic, p_kind, p_payload, p_key, p_headers, p_event_type, p_partition,
                                        p_event_id, p_correlation_id, p_causation_id, p_notify);
    END IF;
    r := {schema}.producer_sequence(p_producer, p_sequence);
    IF r.duplicate THEN
        RETURN r;
    END IF;
    r := {schema}.publish_encoded(p_topic, p_kind, p_payload, p_key, p_headers, p_event_type, p_partition,
                                  p_event_id, p_correlation_id, p_causation_id, p_notify);
    PERFORM {schema}.producer_stored(p_producer, p_sequence, p_topic, r);
    RETURN r;
END;
$$;
