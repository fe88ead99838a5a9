-- Two parts: roles on share groups, and an idempotent SQL publish() (further down).
--
-- Roles on share groups (0011_roles.sql did stream groups): a consume grant of group G on topic T
-- (pgstreams grant ROLE --consume G --topic T) also lets the role use share group G of topic T, and the
-- queue T when G is T: create it or store its settings, acquire, ack, release, reject and renew its
-- events, count its dead letters. Row-level security keeps every other share group's rows out of reach
-- (invisible to its reads, refused to its writes); the schema's owner and its members (admins) are not
-- subject to it. Publishing dead letters needs a produce grant on the dead-letter topic, creating that
-- topic the admin right. Rendered with the target schema as {schema} / '{schema_raw}'.

ALTER TABLE {schema}.share_groups ENABLE ROW LEVEL SECURITY;
ALTER TABLE {schema}.share_partitions ENABLE ROW LEVEL SECURITY;
ALTER TABLE {schema}.share_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted ON {schema}.share_groups USING ({schema}.may_consume(group_name, topic_id));
CREATE POLICY granted ON {schema}.share_partitions USING ({schema}.may_consume(group_name, topic_id));
CREATE POLICY granted ON {schema}.share_events USING ({schema}.may_consume(group_name, topic_id));

-- Whether the current role may use share group p_group of topic p_topic_id (the admins and the granted).
CREATE FUNCTION {schema}.may_share(p_group text, p_topic_id integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_has_role(current_user, (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = '{schema_raw}'),
                       'MEMBER')
        OR {schema}.may_consume(p_group, p_topic_id);
$$;

-- The table rights of a consume grant on share groups (the rows are those of may_consume()).
CREATE FUNCTION {schema}.grant_share_tables(p_role name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I.share_groups, %I.share_partitions TO %I',
                   '{schema_raw}', '{schema_raw}', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.share_events TO %I', '{schema_raw}', p_role);
END;
$$;

-- Consume grants made before this migration get the share tables too.
DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT DISTINCT a.role_name FROM {schema}.acl a
                   WHERE a.privilege = 'consume' AND EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = a.role_name)
    LOOP
        PERFORM {schema}.grant_share_tables(v_role);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.grant_role(p_role name, p_privilege text, p_topic text, p_group text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_id    integer;
    v_table text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(p_role) USING ERRCODE = 'undefined_object';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', '{schema_raw}', p_role);
    EXECUTE format('GRANT SELECT ON %I.topics, %I.segments, %I.segment_partitions, %I.migrations, '
                   '%I.group_config, %I.acl, %I.maintenance, %I.topic_retention TO %I',
                   '{schema_raw}', '{schema_raw}', '{schema_raw}', '{schema_raw}', '{schema_raw}',
                   '{schema_raw}', '{schema_raw}', '{schema_raw}', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE %I.producer_ids TO %I', '{schema_raw}', p_role);
    IF p_privilege = 'admin' THEN
        EXECUTE format('GRANT %I TO %I', (SELECT r.rolname FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner
                                           WHERE n.nspname = '{schema_raw}'), p_role);
        RETURN;
    END IF;
    SELECT id INTO v_id FROM {schema}.topics WHERE name = p_topic;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'topic % does not exist', quote_literal(p_topic) USING ERRCODE = 'no_data_found';
    END IF;
    v_table := 'topic_' || v_id;
    IF p_privilege = 'produce' THEN
        EXECUTE format('GRANT INSERT, SELECT (partition, position, producer) ON %I.%I TO %I',
                       '{schema_raw}', v_table, p_role);
        EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %I.%I TO %I', '{schema_raw}', v_table || '_seq', p_role);
        EXECUTE format('GRANT SELECT, INSERT ON %I.event_ids TO %I', '{schema_raw}', p_role);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.producers TO %I', '{schema_raw}', p_role);
        INSERT INTO {schema}.acl VALUES (p_role, 'produce', v_id, '') ON CONFLICT DO NOTHING;
    ELSIF p_privilege = 'consume' THEN
        EXECUTE format('GRANT SELECT ON %I.%I TO %I', '{schema_raw}', v_table, p_role);
        EXECUTE format('GRANT SELECT ON SEQUENCE %I.%I TO %I', '{schema_raw}', v_table || '_seq', p_role);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I.checkpoints TO %I', '{schema_raw}', p_role);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.leases, %I.members TO %I',
                       '{schema_raw}', '{schema_raw}', p_role);
        EXECUTE format('GRANT SELECT, INSERT ON %I.group_losses TO %I', '{schema_raw}', p_role);
        PERFORM {schema}.grant_share_tables(p_role);
        INSERT INTO {schema}.acl VALUES (p_role, 'consume', v_id, p_group) ON CONFLICT DO NOTHING;
    ELSE
        RAISE EXCEPTION 'unknown privilege %', quote_literal(p_privilege) USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

-- Idempotent SQL publish(): the optional arguments producer and sequence (Kafka's producer id and sequence
-- number). A SQL caller draws a producer id once (new_producer_id(), 0010_idempotent_producer.sql) and
-- numbers its publishes with increasing sequence numbers; a publish retried with the same producer and
-- sequence after an unknown commit outcome is stored once. The state is one row per producer (its last
-- sequence and where that event went), updated in the publishing transaction: it commits or rolls back
-- with the event. Its row lock makes a retry wait for a transaction of the broken session still running.
CREATE TABLE {schema}.producers (
    id         bigint      PRIMARY KEY,
    sequence   bigint      NOT NULL,
    topic_id   integer,
    partition  integer,
    position   bigint,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Record sequence p_sequence of producer p_producer: NULL when it is new (greater than the last one
-- stored), else the duplicate's result (partition and position known for the last sequence only).
CREATE FUNCTION {schema}.producer_sequence(p_producer bigint, p_sequence bigint) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    v_new boolean;
    v_seq bigint;
    r     {schema}.publish_result;
BEGIN
    IF (p_producer IS NULL) <> (p_sequence IS NULL) THEN
        RAISE EXCEPTION 'producer and sequence go together: give both or neither'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_producer < 1 OR p_sequence < 0 THEN
        RAISE EXCEPTION 'producer must be at least 1 (new_producer_id()) and sequence at least 0, got % and %',
                        p_producer, p_sequence USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {schema}.producers AS p (id, sequence, updated_at) VALUES (p_producer, p_sequence, now())
    ON CONFLICT (id) DO UPDATE SET sequence = excluded.sequence, updated_at = excluded.updated_at,
                                   topic_id = NULL, partition = NULL, position = NULL
     WHERE p.sequence < excluded.sequence
    RETURNING true INTO v_new;
    IF v_new THEN
        RETURN NULL;
    END IF;
    SELECT p.sequence, p.partition, p.position INTO v_seq, r.partition, r.position
      FROM {schema}.producers p WHERE p.id = p_producer;
    IF v_seq <> p_sequence THEN
        r.partition := NULL;
        r.position := NULL;
    END IF;
    r.duplicate := true;
    RETURN r;
END;
$$;

CREATE FUNCTION {schema}.publish_sequenced(
    p_topic text, p_kind "char", p_payload bytea, p_key text, p_headers jsonb, p_event_type text,
    p_partition integer, p_event_id text, p_correlation_id text, p_causation_id text, p_notify boolean,
    p_producer bigint, p_sequence bigint
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.publish_result;
BEGIN
    IF p_producer IS NULL AND p_sequence IS NULL THEN
        RETURN {schema}.publish_encoded(p_topic, p_kind, p_payload, p_key, p_headers, p_event_type, p_partition,
                                        p_event_id, p_correlation_id, p_causation_id, p_notify);
    END IF;
    r := {schema}.producer_sequence(p_producer, p_sequence);
    IF r.duplicate THEN
        RETURN r;
    END IF;
    r := {schema}.publish_encoded(p_topic, p_kind, p_payload, p_key, p_headers, p_event_type, p_partition,
                                  p_event_id, p_correlation_id, p_causation_id, p_notify);
    UPDATE {schema}.producers p SET topic_id = (SELECT t.id FROM {schema}.topics t WHERE t.name = p_topic),
                                    partition = r.partition, position = r.position
     WHERE p.id = p_producer;
    RETURN r;
END;
$$;

DROP FUNCTION {schema}.publish(text, jsonb, text, jsonb, text, integer, text, text, text, boolean);
DROP FUNCTION {schema}.publish(text, text, text, jsonb, text, integer, text, text, text, boolean);
DROP FUNCTION {schema}.publish(text, bytea, text, jsonb, text, integer, text, text, text, boolean);

CREATE FUNCTION {schema}.publish(
    topic text, value jsonb, key text DEFAULT NULL, headers jsonb DEFAULT NULL, event_type text DEFAULT NULL,
    "partition" integer DEFAULT NULL, event_id text DEFAULT NULL, correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL, notify boolean DEFAULT true, producer bigint DEFAULT NULL,
    sequence bigint DEFAULT NULL
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {schema}.publish_sequenced($1, 'j', convert_to($2::text, 'UTF8'), $3, $4, $5, $6, $7, $8, $9, $10,
                                      $11, $12);
END;
$$;

CREATE FUNCTION {schema}.publish(
    topic text, value text, key text DEFAULT NULL, headers jsonb DEFAULT NULL, event_type text DEFAULT NULL,
    "partition" integer DEFAULT NULL, event_id text DEFAULT NULL, correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL, notify boolean DEFAULT true, producer bigint DEFAULT NULL,
    sequence bigint DEFAULT NULL
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {schema}.publish_sequenced($1, 's', convert_to($2, 'UTF8'), $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);
END;
$$;

CREATE FUNCTION {schema}.publish(
    topic text, value bytea, key text DEFAULT NULL, headers jsonb DEFAULT NULL, event_type text DEFAULT NULL,
    "partition" integer DEFAULT NULL, event_id text DEFAULT NULL, correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL, notify boolean DEFAULT true, producer bigint DEFAULT NULL,
    sequence bigint DEFAULT NULL
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {schema}.publish_sequenced($1, 'b', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);
END;
$$;

-- Forget producer p_producer (its sequence numbers start again): when it will publish no more.
CREATE FUNCTION {schema}.end_producer(p_producer bigint) RETURNS boolean
LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM {schema}.producers WHERE id = p_producer RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone);
$$;

-- Produce grants made before this migration get the producers table too.
DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT DISTINCT a.role_name FROM {schema}.acl a
                   WHERE a.privilege = 'produce' AND EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = a.role_name)
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.producers TO %I', '{schema_raw}', v_role);
    END LOOP;
END;
$$;
