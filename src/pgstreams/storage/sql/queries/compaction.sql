-- Named queries: compaction of compacted topics (0033_compaction.sql). {schema} is the pgstreams schema;
-- values are always bound parameters. Literal braces are doubled.

-- name: compaction_settings
-- A compaction step's transaction: room to hash or sort a segment's keys in memory.
SELECT set_config('work_mem', '256MB', true);

-- name: compaction_leftovers
SELECT {schema}.compaction_leftovers(%s);

-- name: compaction_map
-- The oldest segments not mapped yet, at most the given number of them (NULL: all).
SELECT {schema}.compaction_map(%s, %s);

-- name: compaction_plan
-- The time is the caller's (a test's clock), else the server's.
SELECT segment, reason FROM {schema}.compaction_plan(%s, coalesce(%s::timestamptz, now()));

-- name: compact_build
SELECT kept, removed, tombstones FROM {schema}.compact_build(%s, %s, coalesce(%s::timestamptz, now()));

-- name: compact_swap
SELECT {schema}.compact_swap(%s, %s, %s, %s, %s);

-- name: compaction_ran
SELECT {schema}.compaction_ran(%s);

-- name: compaction_status
-- Per topic: its dirty ratio, the last compaction and what compaction removed so far.
SELECT t.name, {schema}.dirty_ratio(t.id), c.ran_at, c.compacted_at, coalesce(c.segments_rewritten, 0),
       coalesce(c.events_removed, 0), coalesce(c.tombstones_removed, 0), coalesce(c.bytes_removed, 0)
  FROM {schema}.topics t LEFT JOIN {schema}.topic_compaction c ON c.topic_id = t.id
 WHERE %s::text IS NULL OR t.name = %s
 ORDER BY t.name;

-- name: pin_segments
-- Pin segments of a topic for some seconds (0033_compaction.sql): compaction leaves them as they are.
SELECT {schema}.pin_segments(%s, %s::bigint[], %s);

-- name: pinned_barrier
-- After pin_segments: wait for a rewrite of the topic being swapped in now (it holds the topic table's lock;
-- one that had not checked the pins yet gives up), so that what is read next is what stays.
SELECT 1 FROM {table} LIMIT 0;
