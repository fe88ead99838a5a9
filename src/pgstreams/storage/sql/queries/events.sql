-- Named queries: events. {schema} is the pgstreams schema and {table} / {seq} a topic's event table
-- and position sequence (quoted identifiers, see pgstreams.storage.naming); values are always bound
-- parameters. Literal braces are doubled.

-- Every insert draws its position with next_position(), which first registers the transaction as a
-- publisher of the partition (the read fence, see 0004_partition_fence.sql). The partition is bound twice.
-- The last parameter is the producer tag of a pooled publish (0010_idempotent_producer.sql), else NULL.
-- name: insert_event
INSERT INTO {table} (partition, position, kind, key, value, headers, event_type, event_id, correlation_id,
                     causation_id, producer)
VALUES (%s, {schema}.next_position({topic_id}, %s, {seq_name}::regclass), %s, %s, %s, %s, %s, %s, %s, %s,
        %s)
RETURNING position;

-- name: insert_event_own
-- insert_event for a statement that is its own transaction (autocommit): it registers as the publisher
-- of its partition with one single key (0006_single_key_publish.sql), taken before its position is drawn.
-- The lock is the statement's one-time filter, which the executor evaluates before it produces the row,
-- and so before the column default draws the position (nextval): one Result node, no CTE or subquery scan
-- (a tenth fewer server instructions than a WITH query did). Topic ids below 1024 only. Parameters in
-- insert_event's order without its second partition; the last one is the single key's high bits,
-- (7 << 60) | (partition << 50) | (topic id << 40), computed by the client (every operator evaluated here
-- costs a function look-up and permission check per execution), to which the statement adds L mod 2^40.
INSERT INTO {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id,
                     causation_id, producer)
SELECT %s::integer, %s::"char", %s::text, %s::bytea, %s::jsonb, %s::text, %s::text, %s::text, %s::text, %s::bigint
 WHERE pg_advisory_xact_lock_shared(%s::bigint | (coalesce(pg_sequence_last_value({seq_name}::regclass), 0)
                                                  & 1099511627775)) IS NOT NULL
RETURNING position;

-- name: insert_event_own_lean
-- insert_event_own for an event without headers, event type, correlation and causation ids: only the
-- columns it sets are bound (each column bound costs the executor's set-up of its parameter and
-- projection at every execution). Parameters: partition, kind, key, value, producer tag, the single
-- key's high bits.
INSERT INTO {table} (partition, kind, key, value, producer)
SELECT %s::integer, %s::"char", %s::text, %s::bytea, %s::bigint
 WHERE pg_advisory_xact_lock_shared(%s::bigint | (coalesce(pg_sequence_last_value({seq_name}::regclass), 0)
                                                  & 1099511627775)) IS NOT NULL
RETURNING position;

-- name: insert_event_idempotent
WITH ins AS (
    INSERT INTO {schema}.event_ids (topic_id, event_id, partition, position)
    VALUES (%(topic_id)s, %(event_id)s, %(partition)s,
            {schema}.next_position(%(topic_id)s, %(partition)s, {seq_name}::regclass))
    ON CONFLICT DO NOTHING
    RETURNING partition, position
)
INSERT INTO {table} (partition, position, kind, key, value, headers, event_type, event_id,
                     correlation_id, causation_id, producer)
SELECT ins.partition, ins.position, %(kind)s, %(key)s, %(value)s, %(headers)s, %(event_type)s,
       %(event_id)s, %(correlation_id)s, %(causation_id)s, %(producer)s
  FROM ins
RETURNING position;

-- name: existing_event_id
SELECT partition, position FROM {schema}.event_ids WHERE topic_id = %s AND event_id = %s;

-- name: staging_table
CREATE TEMP TABLE IF NOT EXISTS pgstreams_staging (
    ord bigint, partition integer, kind "char", key text, value bytea, headers jsonb, event_type text,
    event_id text, correlation_id text, causation_id text, producer bigint
) ON COMMIT DELETE ROWS;

-- name: staging_table_dropped
-- staging_table for one transaction only (dropped at its commit): behind a transaction pooler, where a
-- temporary table would stay with a server session that serves other clients.
CREATE TEMP TABLE IF NOT EXISTS pgstreams_staging (
    ord bigint, partition integer, kind "char", key text, value bytea, headers jsonb, event_type text,
    event_id text, correlation_id text, causation_id text, producer bigint
) ON COMMIT DROP;

-- name: join_fence_staged
-- Register the transaction as a publisher of the staged rows' partitions before they draw positions.
SELECT {schema}.join_fence({topic_id}, ARRAY(SELECT DISTINCT partition FROM pgstreams_staging), {seq_name}::regclass);

-- name: join_fence
SELECT {schema}.join_fence({topic_id}, %s::int[], {seq_name}::regclass);

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
                     correlation_id, causation_id, producer)
SELECT n.partition, n.position, n.kind, n.key, n.value, n.headers, n.event_type, n.event_id,
       n.correlation_id, n.causation_id, n.producer
  FROM numbered n
 WHERE n.event_id IS NULL OR n.position IN (SELECT position FROM ids)
 ORDER BY n.ord;

-- name: fences
-- The read fence of each partition (see 0004_partition_fence.sql): read positions below it, in a later
-- statement.
SELECT {schema}.partition_fences({topic_id}, %s::int[], {seq_name}::regclass);

-- name: generic_plans
-- The first statement of a poll sent straight through libpq (one implicit transaction until its sync):
-- the poll's prepared statement runs its generic plan, made once, instead of being planned again at every
-- execution. The planner estimates a custom plan cheaper (it knows the arrays' lengths and the limits),
-- so it would never settle on the generic one, and planning costs more than running the poll (about
-- 100 us against 30 on a 4-partition topic).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: load_fences
-- A poll's first statement: the fences of its partitions, kept in the session for the read that follows.
SELECT {schema}.load_fences({topic_id}, %(partitions)s::int[], {seq_name}::regclass);

-- name: load_fences_local
-- load_fences behind a transaction pooler: the fences kept in settings of the poll's transaction only
-- (0032_transaction_fences.sql).
SELECT {schema}.load_fences_local({topic_id}, %(partitions)s::int[], {seq_name}::regclass);

-- name: loaded_fences
-- After a poll (sent with it): the read fences load_fences loaded for it, in the order of its partitions.
SELECT {schema}.loaded_fences({topic_id});

-- name: time_cursors
-- Per partition, the first position below its fence holding an event created at or after a time.
SELECT c.p, h.position
  FROM unnest(%s::int[], %s::bigint[]) AS c(p, fence)
  LEFT JOIN LATERAL (
      SELECT e.position FROM {table} e
       WHERE e.partition = c.p AND e.created_at >= %s AND e.position < c.fence
       ORDER BY e.position LIMIT 1
  ) h ON true;

-- name: poll
-- A poll's second statement (sent with load_fences): only events below the partitions' fences are read.
-- The nested loop emits the partitions in the order given, each in position order; the outer LIMIT stops
-- it once enough rows are read, so partitions after the cut cost nothing. Both bounds are row comparisons
-- on the read index's (partition, position) and nothing else: with a separate "partition = p" the index
-- scan of every segment below the cursor would start at the partition's first entry (the equality is its
-- start key) and filter its way up to the cursor, O(events of the partition) per poll; and with it, or
-- with a plain range on position, a segment without statistics (a new one) is estimated at a few rows,
-- which the planner would rather sort than read in index order. Segments above the fence cost one index
-- descent each.
-- created_at comes as the interval since the Unix epoch, which the client adds to the epoch in UTC: it
-- loads several times faster than a timestamptz (no conversion to the session's time zone).
SELECT e.partition, e.position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[], {schema}.loaded_fences({topic_id}))
       AS c(p, pos, fence)
 CROSS JOIN LATERAL (
      SELECT * FROM {table} t
       WHERE (t.partition, t.position) > (c.p, c.pos) AND (t.partition, t.position) < (c.p, c.fence)
       ORDER BY t.partition, t.position
       LIMIT %(limit)s
) e
 LIMIT %(total)s;

-- name: poll_checked
-- poll, followed by one trailer row (partition -1) evaluated with the read's own snapshot: its position
-- is the topic's partition count (a consumer of every partition picks new ones up), its txid 1 when
-- retention removed a segment holding events after one of the cursors (see removed_after_cursors, which
-- the reader then runs), else 0. Segments are marked as removed before they are detached and dropped, so
-- a read that missed a segment's events sees its mark here; and while no removed segment lies after the
-- cursors (always, for a topic without retention) a poll needs no other statement. The trailer comes last:
-- UNION ALL appends its branches in order. The removed segments are probed per partition (an index
-- descent each, whatever the number of segments removed so far).
SELECT * FROM (
SELECT e.partition, e.position, e.xid::text::bigint, e.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       e.kind, e.key, e.value, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[], {schema}.loaded_fences({topic_id}))
       AS c(p, pos, fence)
 CROSS JOIN LATERAL (
      SELECT * FROM {table} t
       WHERE (t.partition, t.position) > (c.p, c.pos) AND (t.partition, t.position) < (c.p, c.fence)
       ORDER BY t.partition, t.position
       LIMIT %(limit)s
) e
 LIMIT %(total)s
) e
UNION ALL
SELECT -1, (SELECT t.partitions FROM {schema}.topics t WHERE t.id = {topic_id})::bigint,
       (EXISTS (SELECT 1 FROM unnest(%(partitions)s::int[], %(positions)s::bigint[]) AS c(p, pos)
                 CROSS JOIN LATERAL (
                       SELECT 1 FROM {schema}.segment_partitions sp
                        WHERE sp.topic_id = {topic_id} AND sp.partition = c.p AND sp.removed_at IS NOT NULL
                          AND sp.last_position > c.pos
                        LIMIT 1) r))::int::bigint,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;

-- copy_events and copy_staging: rows without producer tag (Spark writes); the _tagged ones: with it.
-- name: copy_events
COPY {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id, causation_id)
FROM STDIN (FORMAT BINARY);

-- name: copy_staging
COPY pgstreams_staging (ord, partition, kind, key, value, headers, event_type, event_id, correlation_id,
                        causation_id) FROM STDIN;

-- name: copy_events_tagged
COPY {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id, causation_id,
              producer)
FROM STDIN (FORMAT BINARY);

-- name: copy_staging_tagged
COPY pgstreams_staging (ord, partition, kind, key, value, headers, event_type, event_id, correlation_id,
                        causation_id, producer) FROM STDIN;

-- name: new_producer_id
SELECT {schema}.new_producer_id();

-- name: session_busy
-- Whether the session of a publish whose connection broke may still be running it (retried publishes wait
-- until it is not: only then is its outcome settled). Only the role's own sessions show their state.
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state IS DISTINCT FROM 'idle'
                                                 AND state IS NOT NULL);

-- name: produced
-- Where an event of a producer tag is stored in some partitions above a position (a retried publish whose
-- first attempt may have committed): a range of the read index per partition, read from the top.
SELECT e.partition, e.position
  FROM unnest(%(partitions)s::int[]) AS c(p)
 CROSS JOIN LATERAL (
      SELECT t.partition, t.position FROM {table} t
       WHERE (t.partition, t.position) > (c.p, %(floor)s::bigint)
         AND (t.partition, t.position) <= (c.p, 9223372036854775807::bigint)
         AND t.producer = %(producer)s
       ORDER BY t.partition DESC, t.position DESC
       LIMIT 1
) e
 ORDER BY e.position
 LIMIT 1;

-- name: notify
SELECT pg_notify(%s, %s);

-- name: count_produced
-- How many events of a producer tag some partitions hold above a position.
SELECT count(*)
  FROM unnest(%(partitions)s::int[]) AS c(p)
  JOIN {table} t ON (t.partition, t.position) > (c.p, %(floor)s::bigint)
                AND (t.partition, t.position) <= (c.p, 9223372036854775807::bigint)
 WHERE t.producer = %(producer)s;

-- name: insert_many_returning
-- Events without ids, one row per array element (the arrays zipped), in a transaction that registered as
-- the publisher of their partitions (join_fence): a sequence hands out their positions in the order of
-- the rows. Their partitions and positions. The arrays come in binary form (no text escaping per element).
INSERT INTO {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id,
                     causation_id, producer)
SELECT * FROM unnest(%(partition)b::int[], %(kind)b::"char"[], %(key)b::text[], %(value)b::bytea[],
                     %(headers)b::jsonb[], %(event_type)b::text[], %(event_id)b::text[],
                     %(correlation_id)b::text[], %(causation_id)b::text[], %(producer)b::bigint[])
RETURNING partition, position;

