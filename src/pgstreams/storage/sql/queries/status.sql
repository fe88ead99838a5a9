-- Named queries: the database-wide status read by metrics exporters and the web console. {schema} is the
-- pgstreams schema and {table} a topic's event table (quoted identifiers, see pgstreams.storage.naming);
-- values are always bound parameters. A status read costs O(topics + partitions + groups + members):
-- catalog sizes, index probes per partition and checkpoint, and the statistics of sealed segments; only
-- the rows of the segments not sealed yet (the one being filled) are counted, as partition_progress does.

-- name: status_topics
-- Per topic: its definition, size on disk (its segments' tables, indexes and TOAST, from the catalog),
-- segments, where the sealed segments end (their counts are in segment_partitions) and its retention.
SELECT t.id AS topic_id, t.name AS topic, t.partitions, t.segment_size, t.created_at,
       (SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i
         WHERE i.inhparent = to_regclass(format('%%I.%%I', %(schema)s::text, 'topic_' || t.id))) AS bytes,
       (SELECT count(*) FROM {schema}.segments s WHERE s.topic_id = t.id AND s.removing_at IS NULL) AS segments,
       (SELECT coalesce(max(s.hi), 0) FROM {schema}.segments s
         WHERE s.topic_id = t.id AND s.sealed_at IS NOT NULL) AS sealed_end,
       {schema}.topic_limit(t.config, 'retention.ms') AS retention_ms,
       {schema}.topic_limit(t.config, 'retention.events') AS retention_events,
       {schema}.topic_limit(t.config, 'retention.bytes') AS retention_bytes
  FROM {schema}.topics t
 ORDER BY t.name;

-- name: status_sealed
-- The counts of every sealed segment per partition (recorded once, when sealed), removed ones too.
SELECT topic_id, partition, lo, hi, events, removed_at IS NOT NULL AS removed FROM {schema}.segment_partitions;

-- name: status_topic_partitions
-- Per partition of one topic: its head (an index probe) and the events of the unsealed segments (from
-- %(sealed)s on: the segment being filled, whose rows are counted).
SELECT p.p AS partition,
       (SELECT e.position FROM {table} e WHERE e.partition = p.p ORDER BY e.position DESC LIMIT 1) AS head,
       (SELECT count(*) FROM {table} e
         WHERE (e.partition, e.position) >= (p.p, %(sealed)s) AND (e.partition, e.position) < (p.p + 1, 0)) AS tail
  FROM generate_series(0, %(partitions)s - 1) AS p(p);

-- name: status_topic_checkpoints
-- Per checkpoint on one topic: its age; the age of the first unread event (an index probe); the unread
-- events of the unsealed segments, and of the sealed segment holding the checkpoint (the only rows
-- counted: other sealed segments count from their statistics).
SELECT k.group_name AS "group", k.partition, k.position AS checkpoint,
       extract(epoch FROM now() - k.updated_at)::float8 AS checkpoint_age,
       extract(epoch FROM now() - (SELECT e.created_at FROM {table} e
                                    WHERE (e.partition, e.position) > (k.partition, k.position)
                                      AND (e.partition, e.position) < (k.partition + 1, 0)
                                    ORDER BY e.partition, e.position LIMIT 1))::float8 AS lag_seconds,
       (SELECT count(*) FROM {table} e
         WHERE (e.partition, e.position) > (k.partition, greatest(k.position, %(sealed)s - 1))
           AND (e.partition, e.position) < (k.partition + 1, 0)) AS tail,
       (SELECT count(*) FROM {table} e
         WHERE (e.partition, e.position) > (k.partition, k.position)
           AND (e.partition, e.position) < (k.partition, least((k.position / %(size)s + 1) * %(size)s,
                                                              %(sealed)s))) AS in_segment
  FROM {schema}.checkpoints k
 WHERE k.topic_id = %(topic_id)s;

-- name: status_checkpointed_topics
-- The topics some group has checkpoints on (only their checkpoints are read).
SELECT DISTINCT topic_id FROM {schema}.checkpoints;

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
