-- Named queries: the database-wide status read by metrics exporters and the web console. {schema} is the
-- pgstreams schema and {table} a topic's event table (quoted identifiers, see pgstreams.storage.naming);
-- values are always bound parameters. Every query here costs O(topics + partitions + groups + members):
-- index probes per partition and the statistics of sealed segments, never a scan of the log (only the
-- rows of the unsealed segments are counted, see partition_progress in 0008_operations.sql).

-- name: status_topics
-- Per topic: partitions, configuration, size on disk and segments (the retention_status view).
SELECT t.id AS topic_id, t.name AS topic, t.partitions, t.config, t.created_at, r.bytes, r.segments,
       r.retention_ms, r.retention_events, r.retention_bytes, r.oldest_position, r.oldest_at,
       r.events_removed
  FROM {schema}.topics t
  JOIN {schema}.retention_status r ON r.topic_id = t.id
 ORDER BY t.name;

-- name: status_partitions
-- Per topic and partition: the head (newest position in read order), the events stored, and the events
-- retention removed (exact per sealed segment): stored + removed only grows.
SELECT t.name AS topic, p.p AS partition, pp.head, pp.lag AS events,
       (SELECT coalesce(sum(sp.events), 0) FROM {schema}.segment_partitions sp
         WHERE sp.topic_id = t.id AND sp.partition = p.p AND sp.removed_at IS NOT NULL) AS removed_events
  FROM {schema}.topics t
 CROSS JOIN LATERAL generate_series(0, t.partitions - 1) AS p(p)
 CROSS JOIN LATERAL {schema}.partition_progress(t.id, p.p, 0) pp
 WHERE %s::text IS NULL OR t.name = %s
 ORDER BY t.name, p.p;

-- name: status_groups
-- Every group's state per topic and partition (the consumer_group_status view), with the checkpoint's age.
SELECT v.group_name AS "group", v.topic, v.topic_id, v.partition, v.checkpoint, v.head, v.lag,
       v.checkpoint_at, v.owner, v.last_heartbeat, v.stale, v.retry_state,
       extract(epoch FROM now() - v.checkpoint_at)::float8 AS checkpoint_age
  FROM {schema}.consumer_group_status v
 ORDER BY v.group_name, v.topic, v.partition;

-- name: status_first_unread
-- Per checkpoint on one topic: when the first event after it was published (NULL: nothing to read), by
-- one index probe; how far (in seconds) the group is behind.
SELECT k.group_name AS "group", k.partition,
       extract(epoch FROM now() - (SELECT e.created_at FROM {table} e
                                    WHERE e.partition = k.partition AND e.position > k.position
                                    ORDER BY e.position LIMIT 1))::float8 AS lag_seconds
  FROM {schema}.checkpoints k
 WHERE k.topic_id = %s;

-- name: status_now
SELECT now();

-- name: status_members
-- Every registered member: its heartbeat's age, whether it is stale, and how many partitions it owns.
SELECT m.group_name AS "group", t.name AS topic, m.member_id, m.host, m.pid,
       extract(epoch FROM now() - m.last_heartbeat)::float8 AS heartbeat_age,
       m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond' AS stale,
       (SELECT count(*) FROM {schema}.leases l
         WHERE l.group_name = m.group_name AND l.topic_id = m.topic_id AND l.owner = m.member_id) AS partitions
  FROM {schema}.members m JOIN {schema}.topics t ON t.id = m.topic_id
 ORDER BY m.group_name, t.name, m.member_id;

-- name: status_dead_letter_topics
-- The dead-letter topics groups are configured with (besides the default names, "<topic>.dlt").
SELECT DISTINCT dead_letter_topic FROM {schema}.group_config WHERE dead_letter_topic IS NOT NULL;

-- name: browse_events
-- A partition's events from a position on, in read order (the web console's event browser): both bounds
-- are row comparisons on the read index, as in the poll. Committed events only (the statement's snapshot).
SELECT e.partition, e.position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id
  FROM {table} e
 WHERE (e.partition, e.position) >= (%(partition)s, %(position)s)
   AND (e.partition, e.position) < (%(partition)s + 1, 0)
 ORDER BY e.partition, e.position
 LIMIT %(limit)s;

-- name: browse_position_at
-- The first position of a partition holding an event created at or after a time (NULL: none).
SELECT min(e.position) FROM {table} e WHERE e.partition = %s AND e.created_at >= %s;
