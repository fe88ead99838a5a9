-- Held snapshots and share groups: a share group's frontier rows are found at once, whatever their dead
-- versions.
--
-- Every acquisition of new events moves the frontier of a partition (share_partitions.frontier): one
-- update, and so, while a snapshot holds the xmin horizon back, one more row version that neither VACUUM
-- nor page pruning may remove. Finding the row by its key walks every version kept (the chain on its page,
-- from the oldest, and the index entries of those that left it), twice per acquisition (to lock the row,
-- then to update it): the acquisitions of a share group slowed as the hold went on.
--
-- As checkpoints and SQL producers do (row_hint(), 0019_held_snapshots.sql), each session now remembers
-- where it left the current version of the frontier rows it moved (a session setting named
-- row_hint('sf', group/topic/partition)), and the acquisition (storage/sql/shares/advance.sql) looks there
-- first, by tid: one tuple read; it locks and updates the row by that tid, and remembers the new one. The
-- hint is only a hint: the row found there must have the key and be visible to the statement (a version
-- another session updated since is not), else the lookup by key runs as before. A row updated by another
-- acquisition while this one waits for its lock no longer matches the tid and is passed over, as a locked
-- one is with SKIP LOCKED. A setting made in a transaction that rolls back is undone with it.
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

-- The ctid of the current frontier row of each of p_partitions (in their order; NULL for a partition the
-- group has no row of), through the session's hints.
CREATE FUNCTION {schema}.share_frontiers(p_group text, p_topic_id integer, p_partitions integer[])
RETURNS tid[]
LANGUAGE sql STABLE AS $$
    SELECT array_agg(coalesce(
               (SELECT sp.ctid FROM {schema}.share_partitions sp
                 WHERE sp.ctid = nullif(current_setting({schema}.row_hint(
                                            'sf', p_group || '/' || p_topic_id || '/' || u.p), true), '')::tid
                   AND sp.group_name = p_group AND sp.topic_id = p_topic_id AND sp.partition = u.p),
               (SELECT sp.ctid FROM {schema}.share_partitions sp
                 WHERE sp.group_name = p_group AND sp.topic_id = p_topic_id AND sp.partition = u.p))
           ORDER BY u.i)
      FROM unnest(p_partitions) WITH ORDINALITY AS u(p, i);
$$;

-- Remember p_at as where the current frontier row of (p_group, p_topic_id, p_partition) is; returns it.
CREATE FUNCTION {schema}.share_frontier_moved(p_group text, p_topic_id integer, p_partition integer, p_at tid)
RETURNS tid
LANGUAGE sql VOLATILE AS $$
    SELECT set_config({schema}.row_hint('sf', p_group || '/' || p_topic_id || '/' || p_partition),
                      p_at::text, false)::tid;
$$;
