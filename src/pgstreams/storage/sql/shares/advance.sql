-- The acquisition of new events of a share group, rendered per topic ({table}, {topic_id}) and per lock
-- mode ({wait}: "SKIP LOCKED", or nothing to wait for a competing consumer; {frontier_at} and {locked_at}:
-- the frontier row by tid, without waiting only): pgstreams.storage.shares
-- renders it with its own query set, as the core query sets have no {wait}. {schema} is the pgstreams
-- schema; values are always bound parameters. Literal braces are doubled.

-- name: share_advance
-- An acquisition's third statement (after share_take_due and load_fences): new events past the frontier
-- of the first partition (from the turn-th of those given on: callers rotate it, while the list, and so
-- the fences load_fences keeps, stays the same) that has some below its fence, up to max
-- events less those share_take_due took. Its frontier row is locked ({wait}: SKIP LOCKED, going on to the
-- next partition when another consumer is advancing it, or nothing, waiting for it) while the events are
-- read, taken and the frontier moved past them: one statement. A partition whose rows not acquired (released, delayed, waiting for their key) reach the
-- window is not advanced. Events delayed (share_not_before()) or, with ordering by key, behind an earlier
-- event of their key in the group's state or in this batch, get a waiting row ('r'); the others are taken:
-- one batch row per partition ('b'), or with ordering by key one row each ('a'). Returns the events taken,
-- with delivery count 1, state 'a' and the first position of their batch row.
WITH lim AS (
    SELECT greatest(0, %(max)s - coalesce(nullif(current_setting('pgstreams.share_due', true), ''), '0')::int)
           AS n
), f AS MATERIALIZED (
    -- without waiting, each frontier row by its tid (share_frontiers(): the session's hint, else a lookup by
    -- key; migration 0023), not by key: under a held snapshot the key leads to every dead version of the row
    SELECT sp.partition, sp.frontier, c.fence, c.i, sp.ctid AS at
      FROM unnest(%(partitions)s::int[], {schema}.loaded_fences({topic_id}),
                  {schema}.share_frontiers(%(group)s, {topic_id}, %(partitions)s::int[]))
           WITH ORDINALITY AS c(p, fence, at, i)
      JOIN {schema}.share_partitions sp
        ON {frontier_at} sp.group_name = %(group)s AND sp.topic_id = {topic_id} AND sp.partition = c.p
     WHERE sp.frontier < c.fence - 1 AND (SELECT n FROM lim) > 0
       AND (SELECT count(*) FROM (
                SELECT 1 FROM {schema}.share_events w
                 WHERE w.group_name = %(group)s AND w.topic_id = {topic_id} AND w.partition = c.p
                   AND w.state NOT IN ('a', 'b')
                 LIMIT %(window)s) win) < %(window)s
     ORDER BY (c.i - 1 + %(turn)s) %% cardinality(%(partitions)s::int[])
     LIMIT 1
       FOR UPDATE OF sp {wait}
), ev AS MATERIALIZED (
    SELECT e.partition, e.position, e.xid, e.created_at, e.kind, e.key, e.value, e.headers, e.event_type,
           e.event_id, e.correlation_id, e.causation_id, {schema}.share_not_before(e.created_at, e.headers) AS nb
      FROM f CROSS JOIN LATERAL (
          -- both bounds as row comparisons on the read index, and nothing else (see the poll query)
          SELECT * FROM {table} t
           WHERE (t.partition, t.position) > (f.partition, f.frontier)
             AND (t.partition, t.position) < (f.partition, f.fence)
           ORDER BY t.partition, t.position
           LIMIT (SELECT n FROM lim)
      ) e
), cls AS MATERIALIZED (
    SELECT ev.*,
           (ev.nb IS NULL OR ev.nb <= clock_timestamp())
           AND (NOT %(ordered)s OR ev.key IS NULL
                OR (row_number() OVER (PARTITION BY ev.partition, ev.key ORDER BY ev.position) = 1
                    AND NOT EXISTS (
                        SELECT 1 FROM {schema}.share_events o
                         WHERE o.group_name = %(group)s AND o.topic_id = {topic_id} AND o.partition = ev.partition
                           AND o.key = ev.key))) AS take
      FROM ev
), one AS (
    INSERT INTO {schema}.share_events (group_name, topic_id, partition, position, state, deliveries, owner, until,
                                       acquired_at, key)
    SELECT %(group)s, {topic_id}, c.partition, c.position, CASE WHEN c.take THEN 'a' ELSE 'r' END,
           CASE WHEN c.take THEN 1 ELSE 0 END, CASE WHEN c.take THEN %(owner)s END,
           CASE WHEN c.take THEN clock_timestamp() + %(lock_ms)s * interval '1 millisecond'
                ELSE coalesce(c.nb, '-infinity') END,
           CASE WHEN c.take THEN clock_timestamp() END, CASE WHEN %(ordered)s THEN c.key END
      FROM cls c
     WHERE NOT c.take OR %(ordered)s
), batch AS (
    INSERT INTO {schema}.share_events (group_name, topic_id, partition, position, state, deliveries, owner, until,
                                       acquired_at, batch)
    SELECT %(group)s, {topic_id}, c.partition, min(c.position), 'b', 1, %(owner)s,
           clock_timestamp() + %(lock_ms)s * interval '1 millisecond', clock_timestamp(),
           array_agg(c.position ORDER BY c.position)
      FROM cls c
     WHERE c.take AND NOT %(ordered)s
     GROUP BY c.partition
    RETURNING partition, position
), moved AS (
    -- the row f locked (without waiting: by its tid); its new tid is the session's hint for the next one
    UPDATE {schema}.share_partitions sp SET frontier = m.top
      FROM (SELECT ev.partition, max(ev.position) AS top FROM ev GROUP BY ev.partition) m
      JOIN f ON f.partition = m.partition
     WHERE {locked_at} sp.group_name = %(group)s AND sp.topic_id = {topic_id} AND sp.partition = m.partition
    RETURNING {schema}.share_frontier_moved(%(group)s, {topic_id}, sp.partition, sp.ctid)
)
SELECT c.partition, c.position, c.xid::text::bigint, c.created_at - '1970-01-01 00:00:00+00'::timestamptz,
       c.kind, c.key, c.value, c.headers, c.event_type, c.event_id, c.correlation_id, c.causation_id,
       1, 'a'::"char", b.position
  FROM cls c
  LEFT JOIN batch b ON b.partition = c.partition
 WHERE c.take
 ORDER BY c.partition, c.position;
