-- Named queries: groups. {schema} is the pgstreams schema and {table} / {seq} a topic's event table
-- and position sequence (quoted identifiers, see pgstreams.storage.naming); values are always bound
-- parameters. Literal braces are doubled.

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
SELECT group_name AS "group", heartbeat_interval_ms, session_timeout_ms, dead_letter, dead_letter_topic, updated_at
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
-- A group's status per topic and partition (the view counts each partition's head and lag once).
-- lost_events: events retention removed before the group read them, recorded by its consumers, plus
-- those after its checkpoint already removed and not yet recorded (see removed_after, 0008_operations).
SELECT v.group_name AS "group", v.topic, v.partition, v.checkpoint, v.head, v.lag, v.checkpoint_at AS updated_at,
       v.owner, v.pending_owner, v.epoch, v.acquired_at, v.last_heartbeat, v.stale,
       v.retry_state, v.retry_position, v.retry_attempts, v.last_error, v.error_at,
       (SELECT coalesce(sum(gl.events), 0) FROM {schema}.group_losses gl
         WHERE gl.group_name = v.group_name AND gl.topic_id = v.topic_id AND gl.partition = v.partition)
       + (SELECT coalesce(sum(CASE WHEN sp.first_position > coalesce(v.checkpoint, 0) THEN sp.events
                                   ELSE greatest(1, round(sp.events::numeric
                                        * (sp.last_position - coalesce(v.checkpoint, 0))
                                        / (sp.last_position - sp.first_position + 1)))::bigint END), 0)
            FROM {schema}.segment_partitions sp
           WHERE sp.topic_id = v.topic_id AND sp.partition = v.partition AND sp.removed_at IS NOT NULL
             AND sp.last_position > coalesce(v.checkpoint, 0)
             AND NOT EXISTS (SELECT 1 FROM {schema}.group_losses gl
                              WHERE gl.group_name = v.group_name AND gl.topic_id = sp.topic_id
                                AND gl.partition = sp.partition AND gl.segment = sp.segment)) AS lost_events
  FROM {schema}.consumer_group_status v
 WHERE v.group_name = %s AND (%s::text IS NULL OR v.topic = %s)
 ORDER BY v.topic, v.partition;

-- name: list_groups
SELECT group_name AS "group", array_agg(DISTINCT topic ORDER BY topic) AS topics, sum(lag) AS lag
  FROM {schema}.consumer_group_status
 GROUP BY group_name
 ORDER BY group_name;

-- name: group_members
SELECT m.group_name AS "group", t.name AS topic, m.member_id, m.host, m.pid, m.registered_at,
       m.last_heartbeat, m.heartbeat_interval_ms, m.session_timeout_ms,
       m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond' AS stale,
       (SELECT COALESCE(array_agg(l.partition ORDER BY l.partition), '{{}}') FROM {schema}.leases l
         WHERE l.group_name = m.group_name AND l.topic_id = m.topic_id AND l.owner = m.member_id) AS partitions
  FROM {schema}.members m JOIN {schema}.topics t ON t.id = m.topic_id
 WHERE m.group_name = %s AND (%s::text IS NULL OR t.name = %s)
 ORDER BY t.name, m.member_id;

-- name: set_idle_timeout
-- Transaction setting of a handler's transaction: a member paused inside it must not hold locks (and
-- the read fence) forever.
SELECT set_config('idle_in_transaction_session_timeout', %s, true);
