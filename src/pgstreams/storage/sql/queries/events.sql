-- Named queries: events. {schema} is the pgstreams schema and {table} / {seq} a topic's event table
-- and position sequence (quoted identifiers, see pgstreams.storage.naming); values are always bound
-- parameters. Literal braces are doubled.

-- name: insert_event
INSERT INTO {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id, causation_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING position;

-- name: insert_event_idempotent
WITH ins AS (
    INSERT INTO {schema}.event_ids (topic_id, event_id, partition, position)
    VALUES (%(topic_id)s, %(event_id)s, %(partition)s, nextval(%(seq)s::regclass))
    ON CONFLICT DO NOTHING
    RETURNING partition, position
)
INSERT INTO {table} (partition, position, kind, key, value, headers, event_type, event_id,
                     correlation_id, causation_id)
SELECT ins.partition, ins.position, %(kind)s, %(key)s, %(value)s, %(headers)s, %(event_type)s,
       %(event_id)s, %(correlation_id)s, %(causation_id)s
  FROM ins
RETURNING position;

-- name: existing_event_id
SELECT partition, position FROM {schema}.event_ids WHERE topic_id = %s AND event_id = %s;

-- name: staging_table
CREATE TEMP TABLE IF NOT EXISTS pgstreams_staging (
    ord bigint, partition integer, kind "char", key text, value bytea, headers jsonb, event_type text,
    event_id text, correlation_id text, causation_id text
) ON COMMIT DELETE ROWS;

-- name: insert_staged
WITH numbered AS MATERIALIZED (
    SELECT s.*, nextval(%(seq)s::regclass) AS position
      FROM (SELECT * FROM pgstreams_staging ORDER BY ord) s
), ids AS (
    INSERT INTO {schema}.event_ids (topic_id, event_id, partition, position)
    SELECT DISTINCT ON (event_id) %(topic_id)s, event_id, partition, position
      FROM numbered WHERE event_id IS NOT NULL ORDER BY event_id, ord
    ON CONFLICT DO NOTHING
    RETURNING position
)
INSERT INTO {table} (partition, position, kind, key, value, headers, event_type, event_id,
                     correlation_id, causation_id)
SELECT n.partition, n.position, n.kind, n.key, n.value, n.headers, n.event_type, n.event_id,
       n.correlation_id, n.causation_id
  FROM numbered n
 WHERE n.event_id IS NULL OR n.position IN (SELECT position FROM ids)
 ORDER BY n.ord;

-- Start cursors (head_cursors, time_cursors, position_cursor) also return the read fence of the same
-- snapshot: the oldest transaction still in progress, except those known to run in another database (the
-- snapshot's xmax if none). Its events will commit with a smaller id than events already visible, so a
-- cursor placed beyond (fence, 0) would skip them: the caller caps the cursor there.
-- name: head_cursors
WITH f AS (SELECT {schema}.read_fence() AS fence)
SELECT c.p, h.xid::text::bigint, h.position, f.fence::text::bigint
  FROM unnest(%s::int[]) AS c(p) CROSS JOIN f
  LEFT JOIN LATERAL (
      SELECT e.xid, e.position FROM {table} e WHERE e.partition = c.p
       ORDER BY e.xid DESC, e.position DESC LIMIT 1
  ) h ON true;

-- name: time_cursors
WITH f AS (SELECT {schema}.read_fence() AS fence)
SELECT c.p, h.xid::text::bigint, h.position, f.fence::text::bigint
  FROM unnest(%s::int[]) AS c(p) CROSS JOIN f
  LEFT JOIN LATERAL (
      SELECT e.xid, e.position FROM {table} e WHERE e.partition = c.p AND e.created_at >= %s
       ORDER BY e.xid, e.position LIMIT 1
  ) h ON true;

-- name: position_cursor
-- The first event in read order among those at or after a position: every one of them is read again.
WITH f AS (SELECT {schema}.read_fence() AS fence)
SELECT h.xid::text::bigint, h.position, f.fence::text::bigint
  FROM f LEFT JOIN LATERAL (
      SELECT e.xid, e.position FROM {table} e WHERE e.partition = %s AND e.position >= %s
       ORDER BY e.xid, e.position LIMIT 1
  ) h ON true;

-- name: poll
-- Only events below the read fence ({schema}.read_fence(), see 0001_initial.sql) are read.
-- The nested loop emits the partitions in the order given, each in read order; the outer LIMIT stops it
-- once enough rows are read, so partitions after the cut cost nothing.
-- created_at comes as the interval since the Unix epoch, which the client adds to the epoch in UTC: it
-- loads several times faster than a timestamptz (no conversion to the session's time zone).
SELECT e.partition, e.position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id
  FROM unnest(%(partitions)s::int[], %(xids)s::text[], %(positions)s::bigint[]) AS c(p, x, pos)
 CROSS JOIN LATERAL (
      SELECT * FROM {table} t
       WHERE t.partition = c.p
         AND (t.xid, t.position) > (c.x::xid8, c.pos)
         AND t.xid < {schema}.read_fence()
       ORDER BY t.xid, t.position
       LIMIT %(limit)s
 ) e
 LIMIT %(total)s;

-- name: read_fence
-- The visibility fence of batch reads and of streaming offsets: every transaction of this database below
-- it has ended (a long transaction in another database does not hold it back).
SELECT {schema}.read_fence()::text::bigint;

-- name: copy_events
COPY {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id, causation_id)
FROM STDIN (FORMAT BINARY);

-- name: copy_staging
COPY pgstreams_staging (ord, partition, kind, key, value, headers, event_type, event_id, correlation_id,
                        causation_id) FROM STDIN;

-- name: notify
SELECT pg_notify(%s, %s);
