-- Named queries of the Spark data source, loaded by pgstreams.storage.QuerySet. {schema} is the pgstreams
-- schema, {table} a topic's event table (quoted identifiers; a topic's storage names come from
-- pgstreams.storage.TopicTables), {filters} a conjunction of pushed-down filters ("AND ..." fragments from
-- pgstreams.spark._filters, or nothing); values are always bound parameters.
--
-- The "chunk" queries return one row of column-wise aggregates: the positions (int8, big-endian), the
-- creation times (microseconds since 2000-01-01, big-endian), per row the byte lengths ({lengths}: int4,
-- -1 for NULL) of value and of the optional columns returned by length, the values back to back, then
-- {optional}: the optional columns key, event_type, event_id, correlation_id, causation_id and headers,
-- each in the form pgstreams.spark._sql.Layout gives it (texts separated by chr(1) with NULL as chr(2),
-- which needs no per-row length; bytes back to back, with lengths; or not at all), then the partition of
-- each event (page scans; NULL in ordered chunks, whose partition is known), and {counts}: the number of values in each optional column (count() skips
-- NULLs without calling its transition function, so a column that is NULL everywhere costs next to
-- nothing). A chunk with values in a column not returned, or whose delimited texts are ambiguous, is
-- queried again with that column in the richer form. PostgreSQL builds the aggregates in C; Python turns
-- them into Arrow arrays without a loop over rows.

-- name: server_info
SELECT current_setting('server_encoding');

-- name: attached_segments
SELECT s.lo, s.hi, pg_relation_size(c.oid) / current_setting('block_size')::bigint, pg_table_size(c.oid)
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN {schema}.segments s ON s.topic_id = %(topic_id)s AND c.relname = %(segment_prefix)s::text || s.segment
 WHERE i.inhparent = %(parent)s::regclass
 ORDER BY s.lo;

-- The queries below take cursors already capped at the read fences of their partitions, computed by the
-- caller in an earlier statement (pgstreams.storage.EventStore.fences): every event at or below such a
-- cursor is committed or rolled back for good, so bounds on the position alone read a stable set.

-- name: count_between
SELECT c.p, (SELECT count(*) FROM (
        SELECT 1 FROM {table} e
         WHERE e.partition = c.p AND e.position > c.pos AND e.position <= c.epos
         LIMIT %(cap)s) s)
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[], %(end_positions)s::bigint[]) AS c(p, pos, epos)
 ORDER BY c.p;

-- name: nth_cursors
SELECT c.p, h.position
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[], %(end_positions)s::bigint[], %(nth)s::bigint[])
       AS c(p, pos, epos, n)
  LEFT JOIN LATERAL (
      SELECT e.position FROM {table} e
       WHERE e.partition = c.p AND e.position > c.pos AND e.position <= c.epos
       ORDER BY e.position OFFSET c.n - 1 LIMIT 1
  ) h ON true
 ORDER BY c.p;

-- name: legacy_cursors
-- Offsets of the former form (xid, position), "after this event" when events were read in (xid, position)
-- order: per partition, the cursor before the first event below the fence that came after it in that
-- order, at most the fence's cursor. Nothing that came after it is skipped; events of smaller xid stored
-- at larger positions are read again.
SELECT c.p, least(c.fence - 1,
                  (SELECT min(e.position) FROM {table} e
                    WHERE e.partition = c.p AND e.position < c.fence
                      AND (e.xid, e.position) > (c.x::xid8, c.pos)) - 1)
  FROM unnest(%(partitions)s::int[], %(xids)s::text[], %(positions)s::bigint[], %(fences)s::bigint[])
       AS c(p, x, pos, fence)
 ORDER BY c.p;

-- name: scan_pages
-- The events of a range of heap pages of one segment, every wanted topic partition in one pass: one row
-- of column-wise aggregates per group of pages (parameter group) holding events, in the layout of the
-- chunk queries, then the topic partition of each event (int4 big-endian). The rows of a chunk,
-- concatenated column by column, are decoded by pgstreams.spark._arrow.decode_chunk. Aggregating group
-- by group keeps each aggregate small: PostgreSQL reuses its memory from group to group instead of
-- growing (and, at the end of each query, giving back) buffers as large as the whole chunk. For events
-- too large to aggregate a page's worth at once, the per-event placeholder groups by ctid instead (one
-- row per event). Parameter ends holds the end cursor of every topic partition (indexed by partition + 1;
-- 0 for partitions not read), each at most its read fence's cursor; {bounds} adds the start cursors the
-- same way when some partition does not start at the beginning.
SELECT a.* FROM generate_series(%(first_page)s::int, %(end_page)s::int - 1, %(group)s::int) AS g(page)
 CROSS JOIN LATERAL (
SELECT string_agg(int8send(e.position), '') AS positions,
       string_agg(timestamptz_send(e.created_at), ''),
       string_agg({lengths}, ''),
       string_agg(e.value, ''),
       {optional},
       string_agg(int4send(e.partition), ''),
       {counts}
  FROM {table} e
 WHERE e.ctid >= ('(' || g.page || ',0)')::tid
   AND e.ctid < ('(' || least(g.page + %(group)s::int, %(end_page)s::int) || ',0)')::tid
   AND e.position >= %(lo)s AND e.position < %(hi)s
   AND e.position <= (%(ends)s::int8[])[e.partition + 1]
   {bounds}
   {filters}
   {per_event}) a
 WHERE a.positions IS NOT NULL;

-- name: chunk_ordered
SELECT string_agg(int8send(r.position), ''),
       string_agg(timestamptz_send(r.created_at), ''),
       string_agg({lengths}, ''),
       string_agg(r.value, ''),
       {optional},
       NULL::bytea,
       {counts}
  FROM (SELECT * FROM {table} e
         WHERE e.partition = %(partition)s AND e.position > %(position)s AND e.position <= %(end)s
           {filters}
         ORDER BY e.position
         LIMIT %(limit)s) r;

-- name: bulk_read_settings
-- Session settings of the source's connections: bulk reads gain nothing from JIT compilation or
-- parallel workers, which only add start-up cost per query.
SET jit = off; SET max_parallel_workers_per_gather = 0;

-- name: copy_events
-- The writing transaction registers as a publisher of every partition of the topic first (join_fence).
COPY {table} (partition, kind, key, value, headers, event_type, event_id, correlation_id, causation_id)
FROM STDIN;

-- name: removed_between
-- Per partition, what retention removed (segments marked as removed, see 0008_operations.sql) of the
-- events in (start cursor, end cursor]: the first and last removed position in that range and about how
-- many events (exact for segments wholly inside, estimated from positions for a segment cut by a cursor).
-- Marks are committed before a segment is detached, so a check after a read sees every segment it missed.
SELECT c.p, min(greatest(sp.first_position, c.pos + 1)), max(least(sp.last_position, c.epos)),
       sum(greatest(1, round(sp.events::numeric
                             * (least(sp.last_position, c.epos) - greatest(sp.first_position, c.pos + 1) + 1)
                             / (sp.last_position - sp.first_position + 1))))::bigint
  FROM unnest(%(partitions)s::int[], %(positions)s::bigint[], %(end_positions)s::bigint[]) AS c(p, pos, epos)
  JOIN {schema}.segment_partitions sp
    ON sp.topic_id = %(topic_id)s AND sp.partition = c.p AND sp.removed_at IS NOT NULL
   AND sp.last_position > c.pos AND sp.first_position <= c.epos
 GROUP BY c.p
 ORDER BY c.p;
