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
