-- Named queries: topics. {schema} is the pgstreams schema and {table} / {seq} a topic's event table
-- and position sequence (quoted identifiers, see pgstreams.storage.naming); values are always bound
-- parameters. Literal braces are doubled.

-- name: topic_by_name
-- last_position: the last position the topic's sequence handed out (when the role may read it): a lower
-- bound of every position drawn later, which a retried publish searches above (see pgstreams.producer).
SELECT t.id, t.name, t.partitions, t.segment_size, t.config, t.created_at,
       (SELECT max(hi) FROM {schema}.segments s WHERE s.topic_id = t.id) AS segments_end,
       (SELECT CASE WHEN has_sequence_privilege(q.oid, 'SELECT') THEN pg_sequence_last_value(q.oid) END
          FROM (SELECT to_regclass(format('%%I.%%I', %(schema)s::text, 'topic_' || t.id || '_seq')) AS oid) q
       ) AS last_position
  FROM {schema}.topics t WHERE t.name = %(name)s;

-- name: topic_version
-- What a publishing client compares with its cached row of the topic now and then (pgstreams.producer):
-- the partition count and configuration; and whether a consumer waits for the topic's events (see
-- 0027_topic_waiters.sql): if not, the client sends no wake-up notification until it reads this again.
SELECT t.partitions, t.config::text,
       EXISTS (SELECT 1 FROM {schema}.topic_waiters w WHERE w.topic_id = t.id AND w.until > now())
  FROM {schema}.topics t WHERE t.id = %s;

-- name: topic_waiting
-- A consumer of the topic is about to wait for its events: publishers notify for the next p_ttl_s seconds.
SELECT {schema}.topic_waiting(%s, %s);

-- name: topics_by_names
SELECT t.id, t.name, t.partitions, t.segment_size, t.config, t.created_at,
       (SELECT max(hi) FROM {schema}.segments s WHERE s.topic_id = t.id) AS segments_end
  FROM {schema}.topics t WHERE t.name = ANY(%s);

-- name: list_topics
SELECT id, name, partitions, segment_size, config, created_at FROM {schema}.topics ORDER BY name;

-- name: insert_topic
INSERT INTO {schema}.topics (name, partitions, segment_size, config) VALUES (%s, %s, %s, %s)
ON CONFLICT (name) DO NOTHING RETURNING id;

-- name: create_topic_storage
SELECT {schema}.create_topic_storage(%s);

-- name: ensure_segments
SELECT {schema}.ensure_segments(%s, %s);

-- name: analyze_segment
SELECT {schema}.analyze_segment(%s, %s);

-- name: delete_topic
WITH gone AS (DELETE FROM {schema}.topics WHERE name = %s RETURNING id),
     waiters AS (DELETE FROM {schema}.topic_waiters w USING gone WHERE w.topic_id = gone.id),
     keys AS (DELETE FROM {schema}.compaction_keys k USING gone WHERE k.topic_id = gone.id)
SELECT id FROM gone;

-- name: partition_stats
-- Events stored (the lag of a cursor before every event) and head of each partition.
SELECT p.p, pp.lag, pp.head
  FROM generate_series(0, %s - 1) AS p(p)
 CROSS JOIN LATERAL {schema}.partition_progress(%s, p.p, 0) pp
 ORDER BY p.p;

-- name: sequence_last_value
SELECT last_value FROM {seq};

-- name: drop_topic_storage
DROP TABLE IF EXISTS {table} CASCADE;

-- name: drop_topic_sequence
DROP SEQUENCE IF EXISTS {seq};
