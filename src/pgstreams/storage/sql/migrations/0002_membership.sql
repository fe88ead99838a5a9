-- Group membership: per-group configuration, members with heartbeats and session
-- timeouts, partition leases (claim, steal, hand-over, expiry) with fencing epochs, and the
-- consumer_group_status view. Rendered with the target schema as {schema}; literal braces are doubled.

-- Per-group settings shared by every member. NULL means "the built-in default" (see pgstreams.groups).
CREATE TABLE {schema}.group_config (
    group_name            text        PRIMARY KEY,
    heartbeat_interval_ms integer     CHECK (heartbeat_interval_ms > 0),
    session_timeout_ms    integer     CHECK (session_timeout_ms > 0),
    dead_letter           boolean     NOT NULL DEFAULT true,
    dead_letter_topic     text,
    updated_at            timestamptz NOT NULL DEFAULT now()
);

-- Live members of a group on a topic . A member whose last heartbeat is
-- older than its session timeout is stale; the next balancing run of any member deletes it.
CREATE TABLE {schema}.members (
    group_name            text        NOT NULL,
    topic_id              integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    member_id             text        NOT NULL,
    host                  text,
    pid                   integer,
    heartbeat_interval_ms integer     NOT NULL CHECK (heartbeat_interval_ms > 0),
    session_timeout_ms    integer     NOT NULL CHECK (session_timeout_ms > 0),
    registered_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, topic_id, member_id)
);
CREATE INDEX members_topic_idx ON {schema}.members (topic_id);

-- One lease per (group, topic, partition). Only `owner` may process the partition. A member
-- that wants it sets `new_owner`; the owner hands it over after its batch in hand (release_leases).
-- `epoch` grows on every change of owner: a commit names the epoch it was processed under, and
-- store_checkpoint_fenced refuses it once the lease has moved on. The retry_* columns say that the
-- partition is stuck on a failing event (retry_state 'retrying', or 'blocked' when no dead-letter topic
-- takes it and the group retries it forever).
CREATE TABLE {schema}.leases (
    group_name     text        NOT NULL,
    topic_id       integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    partition      integer     NOT NULL,
    owner          text,
    new_owner      text,
    epoch          bigint      NOT NULL DEFAULT 0,
    acquired_at    timestamptz,
    retry_position bigint,
    retry_attempts integer,
    retry_state    text        CHECK (retry_state IN ('retrying', 'blocked')),
    last_error     text,
    error_at       timestamptz,
    PRIMARY KEY (group_name, topic_id, partition)
);
CREATE INDEX leases_topic_idx ON {schema}.leases (topic_id);

-- Register (or refresh) a member and make sure every partition of the topic has a lease row.
CREATE FUNCTION {schema}.register_member(
    p_group text, p_topic_id integer, p_member text, p_host text, p_pid integer,
    p_heartbeat_ms integer, p_session_ms integer
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.members (group_name, topic_id, member_id, host, pid, heartbeat_interval_ms,
                                  session_timeout_ms)
    VALUES (p_group, p_topic_id, p_member, p_host, p_pid, p_heartbeat_ms, p_session_ms)
    ON CONFLICT (group_name, topic_id, member_id) DO UPDATE
       SET host = excluded.host, pid = excluded.pid, heartbeat_interval_ms = excluded.heartbeat_interval_ms,
           session_timeout_ms = excluded.session_timeout_ms, last_heartbeat = now();
    INSERT INTO {schema}.leases (group_name, topic_id, partition)
    SELECT p_group, p_topic_id, g.p
      FROM {schema}.topics t CROSS JOIN LATERAL generate_series(0, t.partitions - 1) AS g(p)
     WHERE t.id = p_topic_id
    ON CONFLICT DO NOTHING;
END;
$$;

-- What a member holds: `alive` (it is registered), the partitions it owns with their epochs, those of
-- them another member waits for (`leaving`), and those it waits for (`incoming`).
CREATE FUNCTION {schema}.member_leases(
    p_group text, p_topic_id integer, p_member text,
    OUT alive boolean, OUT owned integer[], OUT epochs bigint[], OUT leaving integer[], OUT incoming integer[]
)
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.members m
                    WHERE m.group_name = p_group AND m.topic_id = p_topic_id AND m.member_id = p_member),
           COALESCE(array_agg(l.partition ORDER BY l.partition) FILTER (WHERE l.owner = p_member), '{{}}'),
           COALESCE(array_agg(l.epoch ORDER BY l.partition) FILTER (WHERE l.owner = p_member), '{{}}'),
           COALESCE(array_agg(l.partition ORDER BY l.partition)
                    FILTER (WHERE l.owner = p_member AND l.new_owner IS NOT NULL), '{{}}'),
           COALESCE(array_agg(l.partition ORDER BY l.partition) FILTER (WHERE l.new_owner = p_member), '{{}}')
      FROM {schema}.leases l
     WHERE l.group_name = p_group AND l.topic_id = p_topic_id
       AND (l.owner = p_member OR l.new_owner = p_member);
$$;

-- Heartbeat, returning the member's leases.
CREATE FUNCTION {schema}.member_heartbeat(
    p_group text, p_topic_id integer, p_member text,
    OUT alive boolean, OUT owned integer[], OUT epochs bigint[], OUT leaving integer[], OUT incoming integer[]
)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.members SET last_heartbeat = now()
     WHERE group_name = p_group AND topic_id = p_topic_id AND member_id = p_member;
    SELECT * INTO alive, owned, epochs, leaving, incoming
      FROM {schema}.member_leases(p_group, p_topic_id, p_member);
END;
$$;

-- Balancing run of one member (claim, steal and expire leases), serialised per group and topic:
--  1. members whose heartbeat is older than their session timeout are deleted; their leases go to the member waiting for them if it is alive, else
--     become unowned, with a new epoch (the old owner's late commits are fenced);
--  2. with N partitions and M live members, lo = floor(N/M) and hi = ceil(N/M) (the fair share):
--     the member claims unowned partitions while it holds fewer than hi;
--  3. it steals (sets new_owner on a lease of another member) while it holds fewer than lo from members
--     holding more than lo, or fewer than hi from members holding more than hi, busiest member first;
--     a lease already promised to a busy member is redirected before an owned one is asked for.
-- Leases waited for count for the waiting member, not for the owner. Once every member has run, each
-- holds lo or hi partitions. Lease rows are locked in partition order, as commits lock them.
CREATE FUNCTION {schema}.balance_leases(
    p_group text, p_topic_id integer, p_member text,
    OUT alive boolean, OUT owned integer[], OUT epochs bigint[], OUT leaving integer[], OUT incoming integer[]
)
LANGUAGE plpgsql AS $$
DECLARE
    v_n      integer;
    v_m      integer;
    v_lo     integer;
    v_hi     integer;
    v_mine   integer;
    v_victim text;
    v_part   integer;
    r        record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgstreams.leases'), hashtext(p_group || '/' || p_topic_id));
    DELETE FROM {schema}.members m
     WHERE m.group_name = p_group AND m.topic_id = p_topic_id
       AND m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond';

    -- 1. expire: leases owned by (or promised to) members that are gone
    IF EXISTS (SELECT 1 FROM {schema}.leases l
                WHERE l.group_name = p_group AND l.topic_id = p_topic_id
                  AND ((l.owner IS NOT NULL AND NOT EXISTS (
                           SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                              AND m.topic_id = p_topic_id AND m.member_id = l.owner))
                    OR (l.new_owner IS NOT NULL AND NOT EXISTS (
                           SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                              AND m.topic_id = p_topic_id AND m.member_id = l.new_owner)))) THEN
        PERFORM 1 FROM {schema}.leases l WHERE l.group_name = p_group AND l.topic_id = p_topic_id
          ORDER BY l.partition FOR UPDATE;
        UPDATE {schema}.leases l
           SET owner = CASE WHEN EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                                            AND m.topic_id = p_topic_id AND m.member_id = l.new_owner)
                            THEN l.new_owner END,
               new_owner = NULL, epoch = l.epoch + 1, acquired_at = now()
         WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.owner IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                              AND m.topic_id = p_topic_id AND m.member_id = l.owner);
        UPDATE {schema}.leases l SET new_owner = NULL
         WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.new_owner IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                              AND m.topic_id = p_topic_id AND m.member_id = l.new_owner);
    END IF;

    IF EXISTS (SELECT 1 FROM {schema}.members m
                WHERE m.group_name = p_group AND m.topic_id = p_topic_id AND m.member_id = p_member) THEN
        SELECT t.partitions INTO v_n FROM {schema}.topics t WHERE t.id = p_topic_id;
        SELECT count(*) INTO v_m FROM {schema}.members m
         WHERE m.group_name = p_group AND m.topic_id = p_topic_id;
        v_lo := v_n / v_m;
        v_hi := (v_n + v_m - 1) / v_m;
        SELECT count(*) FILTER (WHERE (l.owner = p_member AND l.new_owner IS NULL) OR l.new_owner = p_member)
          INTO v_mine
          FROM {schema}.leases l WHERE l.group_name = p_group AND l.topic_id = p_topic_id;

        -- 2. claim unowned partitions up to the fair share
        IF v_mine < v_hi AND EXISTS (SELECT 1 FROM {schema}.leases l WHERE l.group_name = p_group
                                        AND l.topic_id = p_topic_id AND l.owner IS NULL) THEN
            PERFORM 1 FROM {schema}.leases l WHERE l.group_name = p_group AND l.topic_id = p_topic_id
              ORDER BY l.partition FOR UPDATE;
            FOR r IN SELECT l.partition FROM {schema}.leases l
                      WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.owner IS NULL
                      ORDER BY l.partition LIMIT v_hi - v_mine LOOP
                UPDATE {schema}.leases l
                   SET owner = p_member, new_owner = NULL, epoch = l.epoch + 1, acquired_at = now()
                 WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.partition = r.partition;
                v_mine := v_mine + 1;
            END LOOP;
        END IF;

        -- 3. steal from the busiest members (a lease promised to a busy member is redirected first: it
        --    has not moved yet, so taking it over costs no extra hand-over)
        WHILE v_mine < v_hi LOOP
            v_victim := NULL;
            SELECT e.member INTO v_victim FROM (
                SELECT COALESCE(l.new_owner, l.owner) AS member, count(*) AS c
                  FROM {schema}.leases l
                 WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.owner IS NOT NULL
                 GROUP BY 1
            ) e
             WHERE e.member <> p_member AND (e.c > v_hi OR (v_mine < v_lo AND e.c > v_lo))
             ORDER BY e.c DESC, e.member LIMIT 1;
            EXIT WHEN v_victim IS NULL;
            SELECT l.partition INTO v_part FROM {schema}.leases l
             WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.owner IS NOT NULL
               AND COALESCE(l.new_owner, l.owner) = v_victim
             ORDER BY (l.new_owner IS NOT NULL) DESC, (l.owner = p_member) DESC, l.partition DESC LIMIT 1;
            PERFORM 1 FROM {schema}.leases l WHERE l.group_name = p_group AND l.topic_id = p_topic_id
              ORDER BY l.partition FOR UPDATE;
            UPDATE {schema}.leases l
               SET new_owner = CASE WHEN l.owner = p_member THEN NULL ELSE p_member END
             WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.partition = v_part
               AND COALESCE(l.new_owner, l.owner) = v_victim;
            v_mine := v_mine + 1;
        END LOOP;
    END IF;

    SELECT * INTO alive, owned, epochs, leaving, incoming
      FROM {schema}.member_leases(p_group, p_topic_id, p_member);
END;
$$;

-- Give back leases the member owns under the given epochs: each goes to the member waiting for it if
-- that member is registered, else becomes unowned. Returns the partitions released.
CREATE FUNCTION {schema}.release_leases(
    p_group text, p_topic_id integer, p_member text, p_partitions integer[], p_epochs bigint[]
) RETURNS integer[]
LANGUAGE sql AS $$
    WITH target AS (
        SELECT l.partition FROM {schema}.leases l
          JOIN unnest(p_partitions, p_epochs) AS r(p, e) ON r.p = l.partition AND r.e = l.epoch
         WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.owner = p_member
         ORDER BY l.partition FOR UPDATE OF l
    ), released AS (
        UPDATE {schema}.leases l
           SET owner = CASE WHEN EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                                            AND m.topic_id = p_topic_id AND m.member_id = l.new_owner)
                            THEN l.new_owner END,
               new_owner = NULL, epoch = l.epoch + 1, acquired_at = now()
          FROM target t
         WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.partition = t.partition
        RETURNING l.partition
    )
    SELECT COALESCE(array_agg(partition ORDER BY partition), '{{}}') FROM released;
$$;

-- Leave the group: release every lease (to the member waiting for it, if any), withdraw pending claims,
-- and delete the member. Returns the number of leases released.
CREATE FUNCTION {schema}.leave_group(p_group text, p_topic_id integer, p_member text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM {schema}.members
     WHERE group_name = p_group AND topic_id = p_topic_id AND member_id = p_member;
    PERFORM 1 FROM {schema}.leases l
      WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND (l.owner = p_member OR l.new_owner = p_member)
      ORDER BY l.partition FOR UPDATE;
    UPDATE {schema}.leases l SET new_owner = NULL
     WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.new_owner = p_member;
    UPDATE {schema}.leases l
       SET owner = CASE WHEN EXISTS (SELECT 1 FROM {schema}.members m WHERE m.group_name = p_group
                                        AND m.topic_id = p_topic_id AND m.member_id = l.new_owner)
                        THEN l.new_owner END,
           new_owner = NULL, epoch = l.epoch + 1, acquired_at = now()
     WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.owner = p_member;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- Store a checkpoint on behalf of a member: only while it still owns the partition's lease under the
-- epoch it processed with (4 = fenced, nothing stored); else as store_checkpoint. The lease row stays
-- share-locked until the transaction ends, so the lease cannot move while this commit is in flight.
CREATE FUNCTION {schema}.store_checkpoint_fenced(
    p_group text, p_topic_id integer, p_partition integer,
    p_xid xid8, p_position bigint, p_expected_xid xid8, p_expected_position bigint,
    p_member text, p_epoch bigint
) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {schema}.leases l
      WHERE l.group_name = p_group AND l.topic_id = p_topic_id AND l.partition = p_partition
        AND l.owner = p_member AND l.epoch = p_epoch
        FOR SHARE;
    IF NOT FOUND THEN
        RETURN 4;
    END IF;
    RETURN {schema}.store_checkpoint(p_group, p_topic_id, p_partition, p_xid, p_position,
                                     p_expected_xid, p_expected_position);
END;
$$;

-- Head and lag of one partition after a checkpoint (dynamic: each topic has its own table).
CREATE FUNCTION {schema}.partition_progress(
    p_topic_id integer, p_partition integer, p_xid xid8, p_position bigint, OUT head bigint, OUT lag bigint
)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    EXECUTE format(
        'SELECT (SELECT e.position FROM %1$I.%2$I e WHERE e.partition = $1'
        '         ORDER BY e.xid DESC, e.position DESC LIMIT 1),'
        '       (SELECT count(*) FROM %1$I.%2$I e WHERE e.partition = $1 AND (e.xid, e.position) > ($2, $3))',
        '{schema_raw}', 'topic_' || p_topic_id)
      INTO head, lag USING p_partition, p_xid, p_position;
END;
$$;

-- Per group, topic and partition: the owner and the member waiting for it, the owner's last heartbeat,
-- whether the owner is stale (missed its session timeout, or gone), the checkpoint, head and lag, and
-- whether the group is stuck retrying an event there.
CREATE VIEW {schema}.consumer_group_status AS
SELECT k.group_name, t.name AS topic, k.topic_id, k.partition,
       l.owner, l.new_owner AS pending_owner, l.epoch, l.acquired_at,
       m.last_heartbeat,
       (l.owner IS NOT NULL AND (m.member_id IS NULL
           OR m.last_heartbeat < now() - m.session_timeout_ms * interval '1 millisecond')) AS stale,
       NULLIF(k.position, 0) AS checkpoint, p.head, p.lag, k.updated_at AS checkpoint_at,
       l.retry_state, l.retry_position, l.retry_attempts, l.last_error, l.error_at
  FROM {schema}.checkpoints k
  JOIN {schema}.topics t ON t.id = k.topic_id
  LEFT JOIN {schema}.leases l
         ON l.group_name = k.group_name AND l.topic_id = k.topic_id AND l.partition = k.partition
  LEFT JOIN {schema}.members m
         ON m.group_name = l.group_name AND m.topic_id = l.topic_id AND m.member_id = l.owner
 CROSS JOIN LATERAL {schema}.partition_progress(k.topic_id, k.partition, k.xid, k.position) p;
