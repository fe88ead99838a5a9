-- Named queries: share groups (see 0007_share_groups.sql). {schema} is the pgstreams schema; values are
-- always bound parameters.

-- name: share_group_upsert
-- Create a share group of a topic, or set its settings (those of its latest consumer). A queue stays one.
INSERT INTO {schema}.share_groups (group_name, topic_id, queue, lock_timeout_ms, max_deliveries, dead_letter,
                                   ordering)
VALUES (%(group)s, %(topic_id)s, %(queue)s, %(lock_timeout_ms)s, %(max_deliveries)s, %(dead_letter)s,
        %(ordering)s)
ON CONFLICT (group_name, topic_id) DO UPDATE
   SET queue = {schema}.share_groups.queue OR excluded.queue, lock_timeout_ms = excluded.lock_timeout_ms,
       max_deliveries = excluded.max_deliveries, dead_letter = excluded.dead_letter,
       ordering = excluded.ordering;

-- name: share_group_get
SELECT g.queue, g.lock_timeout_ms, g.max_deliveries, g.dead_letter, g.ordering
  FROM {schema}.share_groups g WHERE g.group_name = %s AND g.topic_id = %s;

-- name: share_may_use
SELECT {schema}.may_share(%s, %s);

-- name: share_partitions_of
SELECT partition FROM {schema}.share_partitions WHERE group_name = %s AND topic_id = %s;

-- name: share_partitions_init
-- A share group's frontier on partitions it has none on yet: every event at or below it is skipped.
INSERT INTO {schema}.share_partitions (group_name, topic_id, partition, start_position, frontier)
SELECT %(group)s, %(topic_id)s, c.p, c.pos, c.pos
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[]) AS c(p, pos)
ON CONFLICT DO NOTHING;

-- name: share_acquisition_settings
-- An acquisition runs in a transaction of its own, with generic plans (planning its statements, over a
-- topic's segments, costs more than running them) and without waiting for its commit to be flushed to
-- disk: an acquisition lost in a crash of PostgreSQL only puts its events back (the frontier returns with
-- it: nothing is skipped), and every ack, release, reject or dead letter, which commit synchronously, flushes
-- the acquisitions committed before it. One disk flush per poll and ack instead of two.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('synchronous_commit', 'off', true);

-- name: share_take_due
-- An acquisition's first statement: events due again, with their events (see share_take_due()). The events
-- were read below a fence before (they are at or below the frontier): this statement's snapshot sees them,
-- unless retention removed them meanwhile (kind is then NULL).
SELECT d.o_partition, d.o_position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id,
       d.o_deliveries, d.o_state, NULL::bigint
  FROM {schema}.share_take_due(%(group)s, {topic_id}, %(partitions)s::int[], %(owner)s, %(max)s, %(lock_ms)s,
                               %(max_deliveries)s, %(dead_letter)s, %(ordered)s, %(expired)s,
                               %(expired_window_ms)s) d
  LEFT JOIN {table} e ON e.partition = d.o_partition AND e.position = d.o_position
 ORDER BY d.o_partition, d.o_position;

-- name: share_forget
-- Remove an owner's rows of events that retention removed from the topic, and count them as lost to the
-- group (share_partitions.lost). Returns how many it removed.
WITH gone AS (
    DELETE FROM {schema}.share_events s
     USING unnest(%(partitions)s::int[], %(positions)s::bigint[]) AS c(partition, position)
     WHERE s.group_name = %(group)s AND s.topic_id = %(topic_id)s AND s.partition = c.partition
       AND s.position = c.position AND s.owner = %(owner)s
    RETURNING s.partition
), counted AS (
    UPDATE {schema}.share_partitions sp SET lost = sp.lost + g.n
      FROM (SELECT partition, count(*) AS n FROM gone GROUP BY partition) g
     WHERE sp.group_name = %(group)s AND sp.topic_id = %(topic_id)s AND sp.partition = g.partition
)
SELECT count(*) FROM gone;

-- name: share_ack_batches
-- Ack whole batch rows (the common case): each given by its partition, first position and every position
-- in it; only those still held by the owner are deleted (share_ack_batch_rows(), migration 0026: each row
-- looked up alone by its key). Returns the deleted rows' partition and first position.
SELECT a.o_partition, a.o_position
  FROM {schema}.share_ack_batch_rows(%(group)s, %(topic_id)s::int, %(owner)s, %(partitions)s::int[],
                                     %(firsts)s::bigint[], %(batches)s::text[]) a;

-- name: share_settle
SELECT * FROM {schema}.share_settle(%(group)s, %(topic_id)s, %(owner)s, %(partitions)s::int[],
                                    %(positions)s::bigint[], %(deliveries)s::int[], %(batches)s::bigint[],
                                    %(action)s::"char",
                                    %(delay_ms)s, %(lock_ms)s, %(max_deliveries)s, %(dead_letter)s);

-- name: share_count
SELECT {schema}.share_count(%s, %s, %s, %s, %s, %s);

-- name: share_status
SELECT s.group_name AS "group", s.topic, s.partition, s.queue, s.start, s.frontier, s.head, s.acquired,
       s.available, s.waiting, s.delivered_too_often, s.oldest_lock, s.removed_too_often, s.rejected,
       s.dead_lettered, s.dead_letter, s.max_deliveries, s.lock_timeout::float8 AS lock_timeout, s.ordering,
       s.lost AS lost_events
  FROM {schema}.share_group_status s
 WHERE s.group_name = %(group)s AND (%(topic)s::text IS NULL OR s.topic = %(topic)s)
 ORDER BY s.topic, s.partition;

-- name: share_state_rows
-- The rows a share group keeps for a topic (events in flight, waiting or being dead-lettered).
SELECT count(*) FROM {schema}.share_events WHERE group_name = %s AND topic_id = %s;

-- name: share_groups_list
SELECT g.group_name, t.name, g.queue FROM {schema}.share_groups g JOIN {schema}.topics t ON t.id = g.topic_id
 ORDER BY g.group_name, t.name;

-- name: share_ack_batches_all
-- Ack whole batch rows all or nothing (see share_ack_batches_all(), migration 0020): raises PSA01 unless
-- every batch row was still held by the owner.
SELECT {schema}.share_ack_batches_all(%(group)s, %(topic_id)s::int, %(owner)s, %(partitions)s::int[],
                                      %(firsts)s::bigint[], %(batches)s::text[]);
