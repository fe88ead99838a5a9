-- Named queries. {schema} is the pgstreams schema, {table} a topic's event table (both quoted
-- identifiers); values are always bound parameters. Literal braces are doubled.

-- name: topic_by_name
SELECT t.id, t.name, t.partitions, t.segment_size, t.config, t.created_at,
       (SELECT max(hi) FROM {schema}.segments s WHERE s.topic_id = t.id)
  FROM {schema}.topics t WHERE t.name = %s;

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
DELETE FROM {schema}.topics WHERE name = %s RETURNING id;

-- name: partition_stats
SELECT p.p,
       (SELECT count(*) FROM {table} e WHERE e.partition = p.p),
       (SELECT e.position FROM {table} e WHERE e.partition = p.p ORDER BY e.xid DESC, e.position DESC LIMIT 1)
  FROM generate_series(0, %s - 1) AS p(p) ORDER BY p.p;

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

-- name: sequence_last_value
SELECT last_value FROM {seq};

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

-- name: init_checkpoints
INSERT INTO {schema}.checkpoints (group_name, topic_id, partition, xid, position)
SELECT %s, %s, c.p, c.x::xid8, c.pos
  FROM unnest(%s::int[], %s::text[], %s::bigint[]) AS c(p, x, pos)
ON CONFLICT DO NOTHING;

-- name: load_checkpoints
SELECT partition, xid::text::bigint, position FROM {schema}.checkpoints
 WHERE group_name = %s AND topic_id = %s AND partition = ANY(%s) ORDER BY partition;

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

-- name: store_checkpoints
SELECT c.p, {schema}.store_checkpoint(%s, %s, c.p, c.x::xid8, c.pos, c.ex::xid8, c.epos)
  FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::text[], %s::bigint[]) AS c(p, x, pos, ex, epos)
 ORDER BY c.p;

-- name: seek_checkpoints
INSERT INTO {schema}.checkpoints AS k (group_name, topic_id, partition, xid, position)
SELECT %s, %s, c.p, c.x::xid8, c.pos FROM unnest(%s::int[], %s::text[], %s::bigint[]) AS c(p, x, pos)
ON CONFLICT (group_name, topic_id, partition)
DO UPDATE SET xid = excluded.xid, position = excluded.position, updated_at = now();

-- name: group_status
SELECT k.group_name, t.name, k.partition, NULLIF(k.position, 0), h.position,
       (SELECT count(*) FROM {table} e WHERE e.partition = k.partition AND (e.xid, e.position) > (k.xid, k.position)),
       k.updated_at
  FROM {schema}.checkpoints k
  JOIN {schema}.topics t ON t.id = k.topic_id
  LEFT JOIN LATERAL (
      SELECT e.position FROM {table} e WHERE e.partition = k.partition
       ORDER BY e.xid DESC, e.position DESC LIMIT 1
  ) h ON true
 WHERE k.topic_id = %s AND (%s::text IS NULL OR k.group_name = %s)
 ORDER BY k.group_name, k.partition;

-- name: groups_of
SELECT DISTINCT k.group_name, t.name, t.id FROM {schema}.checkpoints k JOIN {schema}.topics t ON t.id = k.topic_id
 WHERE %s::text IS NULL OR k.group_name = %s ORDER BY 1, 2;

-- workers: group membership, leases, fenced commits, group configuration and status (0002_membership)

-- name: register_member
SELECT {schema}.register_member(%s, %s, %s, %s, %s, %s, %s);

-- name: member_heartbeat
SELECT alive, owned, epochs, leaving, incoming FROM {schema}.member_heartbeat(%s, %s, %s);

-- name: member_leases
SELECT alive, owned, epochs, leaving, incoming FROM {schema}.member_leases(%s, %s, %s);

-- name: balance_leases
SELECT alive, owned, epochs, leaving, incoming FROM {schema}.balance_leases(%s, %s, %s);

-- name: release_leases
SELECT {schema}.release_leases(%s, %s, %s, %s::int[], %s::bigint[]);

-- name: leave_group
SELECT {schema}.leave_group(%s, %s, %s);

-- name: store_checkpoints_fenced
SELECT c.p, {schema}.store_checkpoint_fenced(%s, %s, c.p, c.x::xid8, c.pos, c.ex::xid8, c.epos, %s, c.ep)
  FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::text[], %s::bigint[], %s::bigint[])
       AS c(p, x, pos, ex, epos, ep)
 ORDER BY c.p;

-- name: set_retry_state
UPDATE {schema}.leases
   SET retry_state = %s, retry_position = %s, retry_attempts = %s, last_error = %s, error_at = now()
 WHERE group_name = %s AND topic_id = %s AND partition = %s AND owner = %s;

-- name: retry_states
-- The failing event each partition was stuck on under its previous owner, and its attempts so far.
SELECT partition, retry_position, retry_attempts FROM {schema}.leases
 WHERE group_name = %s AND topic_id = %s AND partition = ANY(%s) AND retry_state IS NOT NULL
   AND retry_position IS NOT NULL AND retry_attempts IS NOT NULL;

-- name: clear_retry_state
UPDATE {schema}.leases SET retry_state = NULL, retry_position = NULL, retry_attempts = NULL
 WHERE group_name = %s AND topic_id = %s AND partition = ANY(%s) AND retry_state IS NOT NULL;

-- name: get_group_config
SELECT heartbeat_interval_ms, session_timeout_ms, dead_letter, dead_letter_topic, updated_at
  FROM {schema}.group_config WHERE group_name = %s;

-- name: put_group_config
INSERT INTO {schema}.group_config AS g
       (group_name, heartbeat_interval_ms, session_timeout_ms, dead_letter, dead_letter_topic)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (group_name) DO UPDATE
   SET heartbeat_interval_ms = excluded.heartbeat_interval_ms, session_timeout_ms = excluded.session_timeout_ms,
       dead_letter = excluded.dead_letter, dead_letter_topic = excluded.dead_letter_topic, updated_at = now()
RETURNING updated_at;

-- name: consumer_group_status
SELECT group_name, topic, partition, owner, pending_owner, epoch, acquired_at, last_heartbeat, stale,
       checkpoint, head, lag, checkpoint_at, retry_state, retry_position, retry_attempts, last_error, error_at
  FROM {schema}.consumer_group_status
 WHERE group_name = %s AND (%s::text IS NULL OR topic = %s)
 ORDER BY topic, partition;

-- name: group_members
SELECT t.name, m.member_id, m.host, m.pid, m.registered_at, m.last_heartbeat, m.heartbeat_interval_ms,
       m.session_timeout_ms, m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond',
       (SELECT COALESCE(array_agg(l.partition ORDER BY l.partition), '{{}}') FROM {schema}.leases l
         WHERE l.group_name = m.group_name AND l.topic_id = m.topic_id AND l.owner = m.member_id)
  FROM {schema}.members m JOIN {schema}.topics t ON t.id = m.topic_id
 WHERE m.group_name = %s AND (%s::text IS NULL OR t.name = %s)
 ORDER BY t.name, m.member_id;
