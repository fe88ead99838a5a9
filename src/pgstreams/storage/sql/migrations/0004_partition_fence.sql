-- A read fence per partition (Kafka's last stable offset).
--
-- Read order within a partition becomes the position alone, and a partition's fence is the first position
-- that may still belong to an open transaction that published to it: readers read below it. Until now
-- the order was (transaction id, position) and one fence, the oldest transaction running in the
-- database, held back every partition of every topic, whatever that transaction did.
--
-- How a reader knows which open transactions published where: a publishing transaction registers
-- itself before it draws its first position of a topic and before its first event in each partition, by
-- taking advisory locks in shared mode (they never wait for each other), held until it ends (commit,
-- rollback, a lost connection; a prepared transaction keeps them until COMMIT/ROLLBACK PREPARED; a
-- savepoint rolled back releases those taken after it, together with its events). Two keys, in the
-- bigint form of pg_advisory_xact_lock_shared (pg_locks: objsubid 1, key = classid << 32 | objid):
--
--   partition key  (5 << 60) | (topic id << 10) | partition    "this transaction publishes to this partition"
--   topic key      (6 << 60) | (topic id << 40) | (L mod 2^40)  "it drew no position of this topic up to L"
--
-- where L is the topic's position sequence as it stood before the transaction's first position of the
-- topic (every position it draws is above L: positions come from a sequence with CACHE 1). Topic ids
-- must stay below 2^20 (checked), and a transaction must end before its topic hands out 2^40 more
-- positions (L is rebuilt from its low 40 bits and the sequence's current value).
--
-- A reader of a partition P (partition_fences): (1) reads the sequence's value c, (2) then the locks,
-- (3) then reads events in a later statement (a newer snapshot). Fence(P) = min(c + 1, L + 1 of every
-- transaction holding P's partition key, L its smallest topic key of the topic). An event at position
-- p < fence(P) was drawn before (1) (p <= c), so its transaction had registered before (1); it holds no
-- key at (2) (else fence <= L + 1 <= p), so it had ended before (2), and (3) sees it if it committed.
-- No committed event below the fence can appear later: a reader never skips one.
-- Rendered with the target schema as {schema}; literal braces are doubled.

-- Register the calling transaction as a publisher of these partitions of a topic (see above), once per
-- transaction, topic and partition: the keys taken are remembered in the transaction-local setting
-- pgstreams.fenced (reverted with the locks when a savepoint rolls back). Call it before drawing
-- positions: next_position() does for one event, publish_many and Spark writes do before their COPY.
CREATE FUNCTION {schema}.join_fence(p_topic_id integer, p_partitions integer[], p_seq regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_held text := coalesce(current_setting('pgstreams.fenced', true), '');
    v_now  text := v_held;
    v_p    integer;
BEGIN
    IF strpos(v_held, ' ' || p_topic_id || ' ') = 0 THEN
        IF p_topic_id >= 1048576 THEN
            RAISE EXCEPTION 'topic id % is beyond the read fence''s key space (2^20 topics)', p_topic_id
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
        PERFORM pg_advisory_xact_lock_shared(
            (6::bigint << 60) | (p_topic_id::bigint << 40)
            | (coalesce(pg_sequence_last_value(p_seq), 0) & 1099511627775));
        v_now := v_now || ' ' || p_topic_id || ' ';
    END IF;
    FOREACH v_p IN ARRAY p_partitions LOOP
        IF strpos(v_now, ' ' || p_topic_id || '/' || v_p || ' ') = 0 THEN
            PERFORM pg_advisory_xact_lock_shared((5::bigint << 60) | (p_topic_id::bigint << 10) | v_p);
            v_now := v_now || ' ' || p_topic_id || '/' || v_p || ' ';
        END IF;
    END LOOP;
    IF v_now <> v_held THEN
        PERFORM set_config('pgstreams.fenced', v_now, true);
    END IF;
END;
$$;

-- The next position of a topic for an event in partition p_partition, once the transaction is
-- registered as its publisher (join_fence). Every single-event insert draws its position here.
CREATE FUNCTION {schema}.next_position(p_topic_id integer, p_partition integer, p_seq regclass) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF strpos(coalesce(current_setting('pgstreams.fenced', true), ''),
              ' ' || p_topic_id || '/' || p_partition || ' ') = 0 THEN
        PERFORM {schema}.join_fence(p_topic_id, ARRAY[p_partition], p_seq);
    END IF;
    RETURN nextval(p_seq);
END;
$$;

-- The read fence of each of p_partitions (in that order): read positions below it. Call it in a
-- statement of its own and read in a later one (whose snapshot is newer); under REPEATABLE READ or
-- SERIALIZABLE the snapshot may be older than the fence, which is refused.
CREATE FUNCTION {schema}.partition_fences(p_topic_id integer, p_partitions integer[], p_seq regclass)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_last bigint;
    v_now  bigint;
    v_keys bigint[];
    v_vts  text[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgstreams reads need READ COMMITTED isolation, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    -- (1) the last position handed out
    v_last := coalesce(pg_sequence_last_value(p_seq), 0);
    -- (2) then the registrations of this topic's publishers (partition and topic keys)
    SELECT array_agg(l.k), array_agg(l.virtualtransaction) INTO v_keys, v_vts
      FROM (SELECT s.virtualtransaction, (s.classid::bigint << 32) | s.objid::bigint AS k
              FROM pg_lock_status() s
             WHERE s.locktype = 'advisory' AND s.objsubid = 1
               AND s.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())) l
     WHERE (l.k >> 60 = 5 AND (l.k >> 10) & 1125899906842623 = p_topic_id)
        OR (l.k >> 60 = 6 AND (l.k >> 40) & 1048575 = p_topic_id);
    IF v_keys IS NULL THEN
        RETURN array_fill(v_last + 1, ARRAY[cardinality(p_partitions)]);
    END IF;
    -- (3) the sequence again, at least every registered L: the low 40 bits of L rebuild to L
    v_now := coalesce(pg_sequence_last_value(p_seq), 0);
    RETURN ARRAY(
        SELECT least(v_last + 1, (
                   SELECT min(v_now - ((v_now - (b.k & 1099511627775)) & 1099511627775)) + 1
                     FROM unnest(v_keys, v_vts) AS a(k, vt)
                     JOIN unnest(v_keys, v_vts) AS b(k, vt) ON b.vt = a.vt AND b.k >> 60 = 6
                    WHERE a.k >> 60 = 5 AND (a.k & 1023) = c.p))
          FROM unnest(p_partitions) WITH ORDINALITY AS c(p, i)
         ORDER BY c.i);
END;
$$;

-- A reader's fences kept for its next statement (pgstreams.poll_fences): a poll sends
-- load_fences() and its read together; the read takes loaded_fences(), which checks they are this
-- topic's.
CREATE FUNCTION {schema}.load_fences(p_topic_id integer, p_partitions integer[], p_seq regclass) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT set_config('pgstreams.poll_fences',
                      p_topic_id || ':' || {schema}.partition_fences(p_topic_id, p_partitions, p_seq)::text,
                      false)::void;
$$;

CREATE FUNCTION {schema}.loaded_fences(p_topic_id integer) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := coalesce(current_setting('pgstreams.poll_fences', true), '');
BEGIN
    IF split_part(v, ':', 1) <> p_topic_id::text THEN
        RAISE EXCEPTION 'no read fences loaded for topic id %', p_topic_id
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    RETURN split_part(v, ':', 2)::bigint[];
END;
$$;

-- New topics: the read index follows the read order.
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
            value          bytea       NOT NULL,
            headers        jsonb,
            event_type     text,
            event_id       text,
            correlation_id text,
            causation_id   text
        ) PARTITION BY RANGE (position)$f$,
        '{schema_raw}', v_table, quote_ident('{schema_raw}') || '.' || quote_ident(v_table || '_seq'));
    EXECUTE format('CREATE INDEX %I ON %I.%I (partition, position)',
                   v_table || '_read_idx', '{schema_raw}', v_table);
    RETURN {schema}.ensure_segments(p_topic_id, v_size);
END;
$$;

-- Checkpoints become positions: "every event of the partition at or below it is consumed". An existing
-- checkpoint (x, p) in the old order becomes the position before the first event after it in that
-- order (or the partition's last position when none is): nothing is skipped, events stored out of
-- position order around it are delivered again.
DROP VIEW {schema}.consumer_group_status;
DROP FUNCTION {schema}.partition_progress(integer, integer, xid8, bigint);
DROP FUNCTION {schema}.store_checkpoint_fenced(text, integer, integer, xid8, bigint, xid8, bigint, text, bigint);
DROP FUNCTION {schema}.store_checkpoint(text, integer, integer, xid8, bigint, xid8, bigint);

DO $$
DECLARE
    v_id integer;
BEGIN
    FOR v_id IN SELECT id FROM {schema}.topics ORDER BY id LOOP
        EXECUTE format(
            'UPDATE %1$I.checkpoints k SET position = coalesce('
            '    (SELECT min(e.position) - 1 FROM %1$I.%2$I e'
            '      WHERE e.partition = k.partition AND (e.xid, e.position) > (k.xid, k.position)),'
            '    (SELECT max(e.position) FROM %1$I.%2$I e WHERE e.partition = k.partition),'
            '    k.position)'
            ' WHERE k.topic_id = $1', '{schema_raw}', 'topic_' || v_id) USING v_id;
        EXECUTE format('DROP INDEX %I.%I', '{schema_raw}', 'topic_' || v_id || '_read_idx');
        EXECUTE format('CREATE INDEX %I ON %I.%I (partition, position)',
                       'topic_' || v_id || '_read_idx', '{schema_raw}', 'topic_' || v_id);
    END LOOP;
END;
$$;

ALTER TABLE {schema}.checkpoints DROP COLUMN xid;

-- Store a checkpoint given the expected previous one. Returns
-- 1 stored, 0 ignored (already stored / would move backwards), 2 further (stored is beyond expected),
-- 3 older (stored is behind expected).
CREATE FUNCTION {schema}.store_checkpoint(
    p_group text, p_topic_id integer, p_partition integer, p_position bigint, p_expected_position bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_pos bigint;
BEGIN
    SELECT position INTO v_pos FROM {schema}.checkpoints
     WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, position)
        VALUES (p_group, p_topic_id, p_partition, p_position)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN 1;
        END IF;
        SELECT position INTO v_pos FROM {schema}.checkpoints
         WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition
           FOR UPDATE;
    END IF;
    IF v_pos = p_position THEN
        RETURN 0;
    ELSIF v_pos = p_expected_position THEN
        IF p_position < v_pos THEN
            RETURN 0;
        END IF;
        UPDATE {schema}.checkpoints SET position = p_position, updated_at = now()
         WHERE group_name = p_group AND topic_id = p_topic_id AND partition = p_partition;
        RETURN 1;
    ELSIF v_pos > p_expected_position THEN
        RETURN 2;
    ELSE
        RETURN 3;
    END IF;
END;
$$;

-- Store a checkpoint on behalf of a member: only while it still owns the partition's lease under the
-- epoch it processed with (4 = fenced, nothing stored); else as store_checkpoint. The lease row stays
-- share-locked until the transaction ends, so the lease cannot move while this commit is in flight.
CREATE FUNCTION {schema}.store_checkpoint_fenced(
    p_group text, p_topic_id integer, p_partition integer, p_position bigint, p_expected_position bigint,
    p_member text, p_epoch bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {schema}.leases l
      WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.partition = p_partition
        AND l.owner = p_member AND l.epoch = p_epoch
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN 4;
    END IF;
    RETURN {schema}.store_checkpoint(p_group, p_topic_id, p_partition, p_position, p_expected_position);
END;
$$;

-- Head and lag of one partition after a checkpoint (dynamic: each topic has its own table).
CREATE FUNCTION {schema}.partition_progress(
    p_topic_id integer, p_partition integer, p_position bigint, OUT head bigint, OUT lag bigint
)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    EXECUTE format(
        'SELECT (SELECT e.position FROM %1$I.%2$I e WHERE e.partition = $1 ORDER BY e.position DESC LIMIT 1),'
        '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND e.position > $2)',
        '{schema_raw}', 'topic_' || p_topic_id)
      INTO head, lag USING p_partition, p_position;
END;
$$;

-- Per group, topic and partition: the owner and the member waiting for it, the owner's last heartbeat,
-- whether the owner is stale (missed its session timeout, or gone), the checkpoint, head and lag, and
-- whether the group is stuck retrying an event there.
CREATE VIEW {schema}.consumer_group_status AS
SELECT k.group_name, t.name AS topic, k.topic_id, k.partition,
       l.owner, l.new_owner AS pending_owner, l.epoch, l.acquired_at,
       m.last_heartbeat,
       (l.owner IS NOT NULL AND (m.member_id IS NULL
           OR m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond')) AS stale,
       NULLIF(k.position, 0) AS checkpoint, p.head, p.lag, k.updated_at AS checkpoint_at,
       l.retry_state, l.retry_position, l.retry_attempts, l.last_error, l.error_at
  FROM {schema}.checkpoints k
  JOIN {schema}.topics t ON t.id = k.topic_id
  LEFT JOIN {schema}.leases l
         ON l.group_name = k.group_name AND l.topic_id = k.topic_id AND l.partition = k.partition
  LEFT JOIN {schema}.members m
         ON m.group_name = l.group_name AND m.topic_id = l.topic_id AND m.member_id = l.owner
 CROSS JOIN LATERAL {schema}.partition_progress(k.topic_id, k.partition, k.position) p;

-- The snapshot-wide fence of the old read order is gone.
DROP FUNCTION {schema}.read_fence();
