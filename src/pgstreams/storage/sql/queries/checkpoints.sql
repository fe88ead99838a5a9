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
