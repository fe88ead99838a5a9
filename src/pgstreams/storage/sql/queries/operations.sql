-- Named queries: operations (topic configuration, maintenance, retention, group administration).
-- {schema} is the pgstreams schema, {table} a topic's event table and {segment} one of its segments
-- (quoted identifiers, see pgstreams.storage.naming); values are always bound parameters. Literal braces
-- are doubled.

-- name: lock_topic
SELECT id, partitions, config FROM {schema}.topics WHERE name = %s FOR UPDATE;

-- name: set_topic_config
UPDATE {schema}.topics SET config = %s WHERE id = %s;

-- name: set_topic_partitions
UPDATE {schema}.topics SET partitions = %s WHERE id = %s;

-- name: leases_for_new_partitions
-- Groups with members on a topic whose partitions grew get leases on the new partitions (unowned: the
-- members' next balancing rounds claim them).
INSERT INTO {schema}.leases (group_name, topic_id, partition)
SELECT DISTINCT l.group_name, l.topic_id, g.p
  FROM {schema}.leases l CROSS JOIN generate_series(%(first)s, %(count)s - 1) AS g(p)
 WHERE l.topic_id = %(topic_id)s
ON CONFLICT DO NOTHING;

-- name: checkpoints_for_new_partitions
-- Groups reading a topic whose partitions grew start the new partitions from their first event.
INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, position)
SELECT DISTINCT k.group_name, k.topic_id, g.p, 0::bigint
  FROM {schema}.checkpoints k CROSS JOIN generate_series(%(first)s, %(count)s - 1) AS g(p)
 WHERE k.topic_id = %(topic_id)s
ON CONFLICT DO NOTHING;

-- name: apply_settings
-- Settings of a connection of pgstreams' own (a maintenance pass's, a group member's): of its session
-- (local false), or of the transaction (true; behind a transaction pooler, sent with every statement, see
-- Executor.configure). Names and values as two arrays.
SELECT set_config(s.name, s.value, %(local)s)
  FROM unnest(%(names)s::text[], %(values)s::text[]) AS s(name, value);

-- name: server_process
-- The server process of the transaction (behind a pooler in transaction mode it may change from one to the
-- next; see executor.pools_transactions).
SELECT pg_backend_pid();

-- name: maintenance_lock
-- One maintenance pass of a schema at a time (SQL maintain() takes the same key per transaction).
SELECT pg_advisory_lock(hashtext('pgstreams.maintain'), hashtext(%s));

-- name: maintenance_unlock
SELECT pg_advisory_unlock(hashtext('pgstreams.maintain'), hashtext(%s));

-- name: maintenance_leader_lock
-- The maintenance service of a schema runs where this session lock is held (one leader per database).
SELECT pg_try_advisory_lock(hashtext('pgstreams.maintenance-leader'), hashtext(%s));

-- name: maintenance_leader_unlock
SELECT pg_advisory_unlock(hashtext('pgstreams.maintenance-leader'), hashtext(%s));

-- name: maintenance_xact_lock
-- The maintenance lock of a schema for one transaction (behind a transaction pooler: held by a transaction
-- kept open for the pass on a connection of its own). The same key as maintenance_lock and maintain().
SELECT pg_advisory_xact_lock(hashtext('pgstreams.maintain'), hashtext(%s));

-- name: maintenance_lead
-- Take or renew the schema's maintenance lease (0031_maintenance_leader.sql) for %(ttl_ms)s ms: true if
-- %(holder)s leads now (it led already, nobody did, or the last leader's lease ran out).
UPDATE {schema}.maintenance
   SET leader = %(holder)s,
       leader_since = CASE WHEN leader IS DISTINCT FROM %(holder)s OR leader_until < now() THEN now()
                           ELSE leader_since END,
       leader_until = now() + %(ttl_ms)s * interval '1 millisecond'
 WHERE leader IS NULL OR leader = %(holder)s OR leader_until < now()
RETURNING true;

-- name: maintenance_leader
SELECT leader FROM {schema}.maintenance WHERE leader IS NOT NULL AND leader_until >= now();

-- name: maintenance_resign
UPDATE {schema}.maintenance SET leader = NULL, leader_since = NULL, leader_until = NULL WHERE leader = %s;

-- name: topic_ids
SELECT id FROM {schema}.topics ORDER BY id;

-- name: maintenance_topics
-- The topics whose state moved since their last check (0017_maintenance_skips_and_purge.sql).
SELECT topic_id, last_position, config FROM {schema}.maintenance_topics();

-- name: topic_checked
SELECT {schema}.topic_checked(%s, %s, %s);

-- name: detached_segments
SELECT topic_id, segment FROM {schema}.detached_segments();

-- name: segment_detached
UPDATE {schema}.segments SET detached_at = now() WHERE topic_id = %s AND segment = %s;

-- name: purge_lock
-- One purge of a schema's detached segments at a time (a session lock, tried).
SELECT pg_try_advisory_lock(hashtext('pgstreams.purge'), hashtext(%s));

-- name: purge_unlock
SELECT pg_advisory_unlock(hashtext('pgstreams.purge'), hashtext(%s));

-- name: purge_xact_lock
-- purge_lock for one transaction (behind a transaction pooler, held by a transaction kept open for the purge).
SELECT pg_try_advisory_xact_lock(hashtext('pgstreams.purge'), hashtext(%s));

-- name: prepare_segments
SELECT {schema}.prepare_segments(%s);

-- name: seal_segments
SELECT {schema}.seal_segments(%s);

-- name: retention_plan
SELECT segment, events, bytes FROM {schema}.retention_plan(%s, now());

-- name: mark_removing
SELECT {schema}.mark_removing(%s, %s::bigint[], %s, %s);

-- name: retention_ran
SELECT {schema}.retention_ran(%s);

-- name: removing_segments
-- Marked for removal and still attached (the detached ones wait for the purge).
SELECT segment FROM {schema}.segments
 WHERE topic_id = %s AND removing_at IS NOT NULL AND detached_at IS NULL ORDER BY segment;

-- name: segment_detach_state
-- Whether a segment is still attached to its topic table, and whether a concurrent detach of it is
-- pending (interrupted: to be finalized).
SELECT i.inhdetachpending FROM pg_inherits i
 WHERE i.inhrelid = to_regclass(%s) AND i.inhparent = to_regclass(%s);

-- name: detach_segment
-- Takes SHARE UPDATE EXCLUSIVE only: publishers and readers of the topic go on.
ALTER TABLE {table} DETACH PARTITION {segment} CONCURRENTLY;

-- name: finalize_detach
ALTER TABLE {table} DETACH PARTITION {segment} FINALIZE;

-- name: drop_segment_table
DROP TABLE IF EXISTS {segment};

-- name: forget_segment
DELETE FROM {schema}.segments WHERE topic_id = %s AND segment = %s;

-- name: expire_members
SELECT {schema}.expire_members();

-- name: record_maintenance
UPDATE {schema}.maintenance SET ran_at = now(), duration_ms = %s, runner = %s, summary = %s;

-- name: last_maintenance
SELECT ran_at, duration_ms, runner, summary FROM {schema}.maintenance;

-- name: maintain_sql
SELECT {schema}.maintain(%s);

-- name: retention_status
SELECT topic, cleanup_policy, retention_ms, retention_events, retention_bytes, oldest_position, oldest_at,
       bytes, segments, retention_ran_at, segments_removed, events_removed, bytes_removed, dirty_ratio,
       compacted_at, segments_compacted, events_compacted, tombstones_removed, bytes_compacted
  FROM {schema}.retention_status
 WHERE %s::text IS NULL OR topic = %s
 ORDER BY topic;

-- name: removed_after_cursors
-- Per partition, the removed segments holding events after the cursor: run after a poll whose read found
-- some (the trailer of the query poll_checked); see pgstreams.consumer.reader for how a loss is told apart.
SELECT sp.partition, sp.segment, sp.hi, sp.first_position, sp.last_position, sp.events
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[]) AS c(p, pos)
  JOIN {schema}.segment_partitions sp
    ON sp.topic_id = {topic_id} AND sp.partition = c.p AND sp.removed_at IS NOT NULL AND sp.last_position > c.pos
 ORDER BY sp.partition, sp.segment;

-- name: record_losses
INSERT INTO {schema}.group_losses (group_name, topic_id, partition, segment, events)
SELECT %s, %s, c.p, c.s, c.n FROM unnest(%s::int[], %s::bigint[], %s::bigint[]) AS c(p, s, n)
ON CONFLICT DO NOTHING;

-- name: retained_floors
-- Per partition, the last position retention removed (a cursor there loses nothing more).
SELECT partition, max(last_position) FROM {schema}.segment_partitions
 WHERE topic_id = %s AND removed_at IS NOT NULL GROUP BY partition;

-- name: live_members
SELECT m.member_id FROM {schema}.members m JOIN {schema}.topics t ON t.id = m.topic_id
 WHERE m.group_name = %s AND (%s::text IS NULL OR t.name = %s)
   AND m.last_heartbeat >= now() - m.session_timeout_ms * interval '1 millisecond'
 ORDER BY m.member_id;

-- name: group_topic_checkpoints
SELECT partition, position FROM {schema}.checkpoints WHERE group_name = %s AND topic_id = %s ORDER BY partition;

-- name: group_topics
SELECT DISTINCT t.name FROM {schema}.checkpoints k JOIN {schema}.topics t ON t.id = k.topic_id
 WHERE k.group_name = %s ORDER BY t.name;

-- name: shift_back
-- The checkpoint that makes the last n events at or below it be read again: the (n+1)-th event at or below.
SELECT position FROM {table} WHERE partition = %s AND position <= %s ORDER BY position DESC OFFSET %s LIMIT 1;

-- name: shift_forward
-- The n-th event after a checkpoint, below the partition's fence.
SELECT position FROM {table} WHERE partition = %s AND position > %s AND position < %s
 ORDER BY position OFFSET %s LIMIT 1;

-- name: delete_group
-- A group's state on some topics (all when the ids are NULL): checkpoints, leases, stale members, losses.
WITH k AS (DELETE FROM {schema}.checkpoints WHERE group_name = %(group)s
             AND (%(topic_ids)s::int[] IS NULL OR topic_id = ANY(%(topic_ids)s)) RETURNING 1),
     l AS (DELETE FROM {schema}.leases WHERE group_name = %(group)s
             AND (%(topic_ids)s::int[] IS NULL OR topic_id = ANY(%(topic_ids)s))),
     m AS (DELETE FROM {schema}.members WHERE group_name = %(group)s
             AND (%(topic_ids)s::int[] IS NULL OR topic_id = ANY(%(topic_ids)s))),
     x AS (DELETE FROM {schema}.group_losses WHERE group_name = %(group)s
             AND (%(topic_ids)s::int[] IS NULL OR topic_id = ANY(%(topic_ids)s)))
SELECT count(*) FROM k;

-- name: delete_group_config
DELETE FROM {schema}.group_config WHERE group_name = %s
   AND NOT EXISTS (SELECT 1 FROM {schema}.checkpoints WHERE group_name = %s);

-- name: pg_cron_settings
SELECT current_setting('shared_preload_libraries') ~ '(^|[ ,])pg_cron($|[ ,])',
       current_setting('cron.database_name', true), current_database();

-- name: pg_cron_create
CREATE EXTENSION IF NOT EXISTS pg_cron;

-- name: pg_cron_schedule
SELECT cron.schedule_in_database(%s, %s, %s, %s);

-- name: pg_cron_unschedule
SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = %s;

-- name: pg_cron_job
SELECT jobid, schedule, command, database, active FROM cron.job WHERE jobname = %s;

-- name: ping
SELECT 1;

-- name: grant_role
SELECT {schema}.grant_role(%s, %s, %s, %s);

-- name: revoke_role
SELECT {schema}.revoke_role(%s, %s, %s, %s);
