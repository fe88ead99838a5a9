-- The Kafka gateway's transactional producers (pgstreams.kafka.transactions): a transactional id names one
-- producer id, whose epoch goes up each time a producer initialises with that id (an older epoch is then
-- fenced). A transaction's records and offsets are written in one PostgreSQL transaction that stays open
-- until EndTxn: read-committed consumers see them at its commit, and an abort leaves nothing.
--
-- A role granted produce or consume rights (pgstreams grant) may also use the gateway's tables for that:
-- the producer ids, epochs and sequences of its Kafka producers; the membership of its Kafka groups. Roles
-- granted before get them now.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.kafka_producers ADD COLUMN transactional_id text UNIQUE;

CREATE FUNCTION {schema}.grant_kafka_tables(p_role name, p_privilege text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_privilege = 'produce' THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I.kafka_producers, %I.kafka_sequences TO %I',
                       '{schema_raw}', '{schema_raw}', p_role);
        EXECUTE format('GRANT USAGE ON SEQUENCE %I.kafka_producers_producer_id_seq TO %I', '{schema_raw}', p_role);
    ELSE
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.kafka_groups, %I.kafka_members TO %I',
                       '{schema_raw}', '{schema_raw}', p_role);
    END IF;
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
        PERFORM {schema}.grant_kafka_tables(p_role, 'produce');
        INSERT INTO {schema}.acl VALUES (p_role, 'produce', v_id, '') ON CONFLICT DO NOTHING;
    ELSIF p_privilege = 'consume' THEN
        EXECUTE format('GRANT SELECT ON %I.%I TO %I', '{schema_raw}', v_table, p_role);
        EXECUTE format('GRANT SELECT ON SEQUENCE %I.%I TO %I', '{schema_raw}', v_table || '_seq', p_role);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I.checkpoints TO %I', '{schema_raw}', p_role);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.leases, %I.members TO %I',
                       '{schema_raw}', '{schema_raw}', p_role);
        EXECUTE format('GRANT SELECT, INSERT ON %I.group_losses TO %I', '{schema_raw}', p_role);
        PERFORM {schema}.grant_share_tables(p_role);
        PERFORM {schema}.grant_kafka_tables(p_role, 'consume');
        INSERT INTO {schema}.acl VALUES (p_role, 'consume', v_id, p_group) ON CONFLICT DO NOTHING;
    ELSE
        RAISE EXCEPTION 'unknown privilege %', quote_literal(p_privilege) USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

SELECT {schema}.grant_kafka_tables(a.role_name, a.privilege)
  FROM (SELECT DISTINCT c.role_name, c.privilege FROM {schema}.acl c
         WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = c.role_name)) a;
