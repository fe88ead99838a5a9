-- Named queries: checkpoints. {schema} is the pgstreams schema and {table} / {seq} a topic's event table
-- and position sequence (quoted identifiers, see pgstreams.storage.naming); values are always bound
-- parameters. Literal braces are doubled.

-- name: init_checkpoints
INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, xid, position)
SELECT %s, %s, c.p, c.x::xid8, c.pos
  FROM unnest(%s::int[], %s::text[], %s::bigint[]) AS c(p, x, pos)
ON CONFLICT DO NOTHING;

-- name: load_checkpoints
SELECT partition, xid::text::bigint, position FROM {schema}.checkpoints
 WHERE group_name = %s AND topic_id = %s AND partition = ANY(%s) ORDER BY partition;

-- name: store_checkpoints
SELECT c.p, {schema}.store_checkpoint(%s, %s, c.p, c.x::xid8, c.pos, c.ex::xid8, c.epos)
  FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::text[], %s::bigint[]) AS c(p, x, pos, ex, epos)
 ORDER BY c.p;

-- name: seek_checkpoints
INSERT INTO {schema}.checkpoints AS k (group_name, topic_id, partition, xid, position)
SELECT %s, %s, c.p, c.x::xid8, c.pos FROM unnest(%s::int[], %s::text[], %s::bigint[]) AS c(p, x, pos)
ON CONFLICT (group_name, topic_id, partition)
DO UPDATE SET xid = excluded.xid, position = excluded.position, updated_at = now();

-- name: mirror_checkpoints
INSERT INTO {schema}.checkpoints AS k (group_name, topic_id, partition, xid, position)
SELECT %s, %s, c.p, c.x::xid8, c.pos FROM unnest(%s::int[], %s::text[], %s::bigint[]) AS c(p, x, pos)
ON CONFLICT (group_name, topic_id, partition)
DO UPDATE SET xid = excluded.xid, position = excluded.position, updated_at = now()
 WHERE (k.xid, k.position) IS DISTINCT FROM (excluded.xid, excluded.position);

-- name: store_checkpoints_fenced
SELECT c.p, {schema}.store_checkpoint_fenced(%s, %s, c.p, c.x::xid8, c.pos, c.ex::xid8, c.epos, %s, c.ep)
  FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::text[], %s::bigint[], %s::bigint[])
       AS c(p, x, pos, ex, epos, ep)
 ORDER BY c.p;
