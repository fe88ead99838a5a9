-- Named queries: the database-wide status read by metrics exporters and the web console. {schema} is the
-- pgstreams schema and {table} a topic's event table (quoted identifiers, see pgstreams.storage.naming);
-- values are always bound parameters. A status read costs O(topics + partitions + groups + members), in a
-- constant number of statements: catalog sizes, the statistics of sealed segments, index probes per
-- checkpoint; only the rows of the segments not sealed yet (the one being filled) are counted, as
-- partition_progress does, and only for topics that may have changed since the last read (0014).

-- name: status_topics
-- Per topic: its definition, segments, where the sealed segments end (their counts are in
-- segment_partitions), its retention and compaction's figures.
SELECT t.id AS topic_id, t.name AS topic, t.partitions, t.segment_size, t.created_at,
       (SELECT count(*) FROM {schema}.segments s WHERE s.topic_id = t.id AND s.removing_at IS NULL) AS segments,
       (SELECT coalesce(max(s.hi), 0) FROM {schema}.segments s
         WHERE s.topic_id = t.id AND s.sealed_at IS NOT NULL) AS sealed_end,
       {schema}.topic_limit(t.config, 'retention.ms') AS retention_ms,
       {schema}.topic_limit(t.config, 'retention.events') AS retention_events,
       {schema}.topic_limit(t.config, 'retention.bytes') AS retention_bytes,
       CASE WHEN {schema}.compacts(t.config) THEN {schema}.dirty_ratio(t.id) END AS dirty_ratio,
       c.compacted_at, coalesce(c.events_removed, 0) AS events_compacted,
       coalesce(c.bytes_removed, 0) AS bytes_compacted
  FROM {schema}.topics t
  LEFT JOIN {schema}.topic_compaction c ON c.topic_id = t.id
 ORDER BY t.name;

-- name: status_sealed
-- The counts and last positions of every sealed segment per partition (recorded once, when sealed, and
-- again when compaction rewrites it), removed ones too; and per partition, as a removed span of no
-- positions, the events compaction removed (0033_compaction.sql).
SELECT topic_id, partition, lo, hi, events, removed_at IS NOT NULL AS removed, last_position
  FROM {schema}.segment_partitions
UNION ALL
SELECT topic_id, partition, 0, 0, events_removed, true, 0
  FROM {schema}.partition_compaction WHERE events_removed > 0;

-- name: status_marks
-- Per topic: the last position handed out and whether a publisher is registered (status_marks(), 0014).
SELECT topic_id, last_position, publishing FROM {schema}.status_marks();

-- name: status_partitions
-- Per partition of the given topics: the newest position and the count of the events from the given
-- positions on (where each topic's sealed segments end), in the segments starting at or before each
-- topic's last position handed out (migration 0025); partitions without such events are left out.
SELECT topic_id, partition, head, events
  FROM {schema}.status_partitions(%(topic_ids)s::integer[], %(from)s::bigint[], %(last)s::bigint[]);

-- name: status_checkpoints
-- Per checkpoint on the given topics: the time of its first unread event, and its unread events outside
-- the statistics of the sealed segments (status_checkpoints(), 0014).
SELECT group_name AS "group", topic_id, partition, checkpoint, first_unread_at, tail, in_segment
  FROM {schema}.status_checkpoints(%(topic_ids)s, %(from)s, %(size)s);

-- name: status_bytes
-- Per given topic: the size of its segments' data (tables, indexes and TOAST, main forks: status_sizes(),
-- migration 0021), of the segments starting at or before its last position handed out (migration 0025).
SELECT topic_id, bytes FROM {schema}.status_sizes(%(topic_ids)s::integer[], %(last)s::bigint[]);

-- name: status_checkpoints_of
-- status_checkpoints with its topics as lag_ids (beside status_bytes' topic_ids), columns in order.
SELECT group_name, topic_id, partition, checkpoint, first_unread_at, tail, in_segment
  FROM {schema}.status_checkpoints(%(lag_ids)s::integer[], %(from)s::bigint[], %(size)s::bigint[]);

-- name: status_checkpoint_positions
-- Every checkpoint: its position and age (what a kept figure of its lag is keyed by).
SELECT group_name AS "group", topic_id, partition, position AS checkpoint,
       extract(epoch FROM now() - updated_at)::float8 AS checkpoint_age
  FROM {schema}.checkpoints;

-- name: status_leases
-- Every lease: its owner, whether the owner is stale (missed its session timeout, or gone), retry state.
SELECT l.group_name AS "group", l.topic_id, l.partition, l.owner, l.retry_state,
       (l.owner IS NOT NULL AND (m.member_id IS NULL
           OR m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond')) AS stale
  FROM {schema}.leases l
  LEFT JOIN {schema}.members m
         ON m.group_name = l.group_name AND m.topic_id = l.topic_id AND m.member_id = l.owner;

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

-- name: status_shares
-- Every share group per topic and partition (the share_group_status view: its rows of events in flight
-- and the partition's progress after its frontier: O(share partitions + events in flight)).
SELECT s.group_name AS "group", s.topic, s.partition, s.queue, s.start, s.frontier, s.head, s.acquired,
       s.available, s.waiting, s.delivered_too_often, s.oldest_lock, s.removed_too_often, s.rejected,
       s.dead_lettered, s.dead_letter, s.max_deliveries, s.lock_timeout::float8 AS lock_timeout, s.ordering,
       s.lost AS lost_events
  FROM {schema}.share_group_status s
 ORDER BY s.group_name, s.topic, s.partition;

-- name: status_dead_letter_topics
-- The dead-letter topics groups and share groups are configured with (besides the default names,
-- "<topic>.dlt").
SELECT dead_letter_topic FROM {schema}.group_config WHERE dead_letter_topic IS NOT NULL
 UNION
SELECT dead_letter FROM {schema}.share_groups WHERE dead_letter IS NOT NULL;

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

-- name: browse_events_before
-- A partition's events before a position, newest first (the event browser's newest-first pages): the
-- bounds are row comparisons on the read index, read backwards. Committed events only.
SELECT e.partition, e.position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id
  FROM {table} e
 WHERE (e.partition, e.position) < (%(partition)s, %(before)s)
   AND (e.partition, e.position) >= (%(partition)s, 0)
 ORDER BY e.partition DESC, e.position DESC
 LIMIT %(limit)s;

-- name: browse_key
-- The events with a key among at most %(scan)s of a partition's events before a position, newest first
-- (the event browser's search: a bounded walk back on the read index, the key compared on each row), each
-- with the lowest position the walk reached and how many events it walked through; one row of NULL events
-- with those two when none has the key.
WITH walked AS (
    SELECT e.partition, e.position, e.xid, e.created_at, e.kind, e.key, e.value, e.headers, e.event_type,
           e.event_id, e.correlation_id, e.causation_id
      FROM {table} e
     WHERE (e.partition, e.position) < (%(partition)s, %(before)s)
       AND (e.partition, e.position) >= (%(partition)s, 0)
     ORDER BY e.partition DESC, e.position DESC
     LIMIT %(scan)s
), found AS (
    SELECT * FROM walked w WHERE w.key = %(key)s ORDER BY w.position DESC LIMIT %(limit)s
)
SELECT f.partition, f.position, f.xid::text::bigint, f.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       f.kind, f.key, f.value, f.headers, f.event_type, f.event_id, f.correlation_id, f.causation_id,
       s.lowest, s.walked
  FROM (SELECT min(position) AS lowest, count(*) AS walked FROM walked) s
  LEFT JOIN found f ON true
 ORDER BY f.position DESC;
