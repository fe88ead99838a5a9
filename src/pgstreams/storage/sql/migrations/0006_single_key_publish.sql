-- A single-event publish that is its own transaction registers with one advisory lock instead of two.
--
-- Until now every publishing transaction took a partition key and a topic key (0004_partition_fence.sql)
-- through next_position(), a plpgsql function that also remembers the keys in a transaction-local
-- setting: together a fifth of the server time of an autocommit single-row publish. A transaction that
-- is one INSERT of one event needs neither the bookkeeping nor two keys:
--
--   single key  (7 << 60) | (partition << 50) | (topic id << 40) | (L mod 2^40)
--
-- "this transaction publishes to this partition, and drew no position of this topic up to L", taken in
-- the INSERT itself before its position is drawn (query insert_event_own). Topic ids and partitions
-- must be below 2^10 for it (MAX_PARTITIONS is 1024); other topics keep the two keys.
--
-- partition_fences() now reads, per holding transaction, the partitions it registered (partition keys
-- and single keys) and its smallest L (topic keys and single keys). A transaction may hold keys of every
-- kind: the argument of 0004 holds for each kind alone and so for their union.
-- Rendered with the target schema as {schema}; literal braces are doubled.

CREATE OR REPLACE FUNCTION {schema}.partition_fences(p_topic_id integer, p_partitions integer[], p_seq regclass)
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
    -- (2) then the registrations of this topic's publishers (partition, topic and single keys)
    SELECT array_agg(l.k), array_agg(l.virtualtransaction) INTO v_keys, v_vts
      FROM (SELECT s.virtualtransaction, (s.classid::bigint << 32) | s.objid::bigint AS k
              FROM pg_lock_status() s
             WHERE s.locktype = 'advisory' AND s.objsubid = 1
               AND s.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())) l
     WHERE (l.k >> 60 = 5 AND (l.k >> 10) & 1125899906842623 = p_topic_id)
        OR (l.k >> 60 = 6 AND (l.k >> 40) & 1048575 = p_topic_id)
        OR (l.k >> 60 = 7 AND (l.k >> 40) & 1023 = p_topic_id);
    IF v_keys IS NULL THEN
        RETURN array_fill(v_last + 1, ARRAY[cardinality(p_partitions)]);
    END IF;
    -- (3) the sequence again, at least every registered L: the low 40 bits of L rebuild to L
    v_now := coalesce(pg_sequence_last_value(p_seq), 0);
    RETURN ARRAY(
        WITH k AS (SELECT * FROM unnest(v_keys, v_vts) AS u(k, vt)),
             held AS (SELECT k.vt, CASE WHEN k.k >> 60 = 5 THEN k.k & 1023 ELSE (k.k >> 50) & 1023 END AS p
                        FROM k WHERE k.k >> 60 IN (5, 7)),
             low AS (SELECT k.vt, min(v_now - ((v_now - (k.k & 1099511627775)) & 1099511627775)) AS l
                       FROM k WHERE k.k >> 60 IN (6, 7) GROUP BY k.vt)
        SELECT least(v_last + 1, (SELECT min(low.l) + 1 FROM held JOIN low ON low.vt = held.vt
                                   WHERE held.p = c.p))
          FROM unnest(p_partitions) WITH ORDINALITY AS c(p, i)
         ORDER BY c.i);
END;
$$;

-- A poll's fences again only when something may have changed. If the sequence has not moved since the
-- session last loaded the fences of the same topic and partitions, and they were all "last position
-- + 1" (no open publisher held any of them back), they still are: no position was drawn since, and every
-- transaction that drew one had ended. pg_lock_status() (it copies the lock table) is skipped then:
-- consumers and workers that poll an idle topic, or recheck one, cost a sequence read.
CREATE OR REPLACE FUNCTION {schema}.load_fences(p_topic_id integer, p_partitions integer[], p_seq regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_last   bigint := coalesce(pg_sequence_last_value(p_seq), 0);
    v_key    text := p_topic_id || ':' || v_last || ':' || p_partitions::text;
    v_fences bigint[];
BEGIN
    IF current_setting('pgstreams.poll_fences_clean', true) = v_key THEN
        RETURN;  -- pgstreams.poll_fences holds them
    END IF;
    v_fences := {schema}.partition_fences(p_topic_id, p_partitions, p_seq);
    PERFORM set_config('pgstreams.poll_fences', p_topic_id || ':' || v_fences::text, false);
    PERFORM set_config('pgstreams.poll_fences_clean',
                       CASE WHEN v_last + 1 = ALL (v_fences) THEN v_key ELSE '' END, false);
END;
$$;
