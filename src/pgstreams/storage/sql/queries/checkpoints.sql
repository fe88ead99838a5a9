-- Named queries: checkpoints. {schema} is the pgstreams schema; values are always bound parameters.
-- A checkpoint is a position: every event of the partition at or below it is consumed (0: none).

-- name: init_checkpoints
INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, position)
SELECT %s, %s, c.p, c.pos
  FROM unnest(%s::int[], %s::bigint[]) AS c(p, pos)
ON CONFLICT DO NOTHING;

-- name: load_checkpoints
SELECT partition, position FROM {schema}.checkpoints
 WHERE group_name = %s AND topic_id = %s AND partition = ANY(%s) ORDER BY partition;

-- name: store_checkpoints
SELECT c.p, {schema}.store_checkpoint(%s, %s, c.p, c.pos, c.epos)
  FROM unnest(%s::int[], %s::bigint[], %s::bigint[]) AS c(p, pos, epos)
 ORDER BY c.p;

-- name: store_checkpoints_lazy
-- store_checkpoints whose commit does not wait for its WAL to reach the disk (the statement is its own
-- transaction, on an autocommit connection): visible at once, durable at the next flush (any synchronous
-- commit, or the WAL writer within 3 x wal_writer_delay). A crash of PostgreSQL before that brings the
-- checkpoint back to an earlier one: events are read again, never skipped.
SELECT c.p, {schema}.store_checkpoint(%s, %s, c.p, c.pos, c.epos)
  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy,
       unnest(%s::int[], %s::bigint[], %s::bigint[]) AS c(p, pos, epos)
 ORDER BY c.p;

-- name: seek_checkpoints
INSERT INTO {schema}.checkpoints AS k (group_name, topic_id, partition, position)
SELECT %s, %s, c.p, c.pos FROM unnest(%s::int[], %s::bigint[]) AS c(p, pos)
ON CONFLICT (group_name, topic_id, partition)
DO UPDATE SET position = excluded.position, updated_at = now();

-- name: mirror_checkpoints
INSERT INTO {schema}.checkpoints AS k (group_name, topic_id, partition, position)
SELECT %s, %s, c.p, c.pos FROM unnest(%s::int[], %s::bigint[]) AS c(p, pos)
ON CONFLICT (group_name, topic_id, partition)
DO UPDATE SET position = excluded.position, updated_at = now()
 WHERE k.position IS DISTINCT FROM excluded.position;

-- name: store_checkpoints_fenced
SELECT c.p, {schema}.store_checkpoint_fenced(%s, %s, c.p, c.pos, c.epos, %s, c.ep)
  FROM unnest(%s::int[], %s::bigint[], %s::bigint[], %s::bigint[]) AS c(p, pos, epos, ep)
 ORDER BY c.p;

-- name: store_checkpoints_fenced_lazy
-- store_checkpoints_fenced without waiting for the commit's flush (see store_checkpoints_lazy).
SELECT c.p, {schema}.store_checkpoint_fenced(%s, %s, c.p, c.pos, c.epos, %s, c.ep)
  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy,
       unnest(%s::int[], %s::bigint[], %s::bigint[], %s::bigint[]) AS c(p, pos, epos, ep)
 ORDER BY c.p;
