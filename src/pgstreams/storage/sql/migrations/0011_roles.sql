-- Least-privilege roles, enforced by PostgreSQL itself: table grants, row-level security and a few
-- SECURITY DEFINER functions (pgstreams grant / revoke, Client.grant / Client.revoke).
--
--   produce  INSERT on the topic's table and USAGE on its sequence (plus SELECT of the columns a retried
--            publish looks up: partition, position, producer), its event ids (rows of its topics only).
--   consume  SELECT on the topic's table and sequence; the group's checkpoints (create, store forwards:
--            never backwards, which is a reset), leases, members and recorded losses, rows of the granted
--            (group, topic) pairs only (row-level security).
--   admin    membership in the role that owns the schema: everything, including creating, altering and
--            deleting topics, resetting and deleting groups, maintenance.
-- Both kinds read the catalogue tables (topics, segments, ...). Creating segments ahead and column
-- statistics of new segments run as the schema's owner (SECURITY DEFINER, fixed search_path), so that
-- publishers need no DDL right. Grants name tables of existing topics: a topic deleted and created again
-- needs its grants again. Rendered with the target schema as {schema} / '{schema_raw}'.

CREATE TABLE {schema}.acl (
    role_name  name    NOT NULL,
    privilege  text    NOT NULL CHECK (privilege IN ('produce', 'consume')),
    topic_id   integer NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    group_name text    NOT NULL DEFAULT '',
    PRIMARY KEY (role_name, privilege, topic_id, group_name)
);

-- Whether the current role (or a role it is a member of) may act for group p_group on topic p_topic_id.
CREATE FUNCTION {schema}.may_consume(p_group text, p_topic_id integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.acl a
                    WHERE a.privilege = 'consume' AND a.group_name = p_group AND a.topic_id = p_topic_id
                      AND pg_has_role(current_user, a.role_name, 'MEMBER'));
$$;

CREATE FUNCTION {schema}.may_produce(p_topic_id integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.acl a
                    WHERE a.privilege = 'produce' AND a.topic_id = p_topic_id
                      AND pg_has_role(current_user, a.role_name, 'MEMBER'));
$$;

-- Row-level security: the table owner (and its members, the admins, through the owner's rights) is not
-- subject to it; other roles see and change only their granted rows. Costs nothing for the owner.
ALTER TABLE {schema}.checkpoints ENABLE ROW LEVEL SECURITY;
ALTER TABLE {schema}.leases ENABLE ROW LEVEL SECURITY;
ALTER TABLE {schema}.members ENABLE ROW LEVEL SECURITY;
ALTER TABLE {schema}.group_losses ENABLE ROW LEVEL SECURITY;
ALTER TABLE {schema}.event_ids ENABLE ROW LEVEL SECURITY;
CREATE POLICY granted ON {schema}.checkpoints USING ({schema}.may_consume(group_name, topic_id));
CREATE POLICY granted ON {schema}.leases USING ({schema}.may_consume(group_name, topic_id));
CREATE POLICY granted ON {schema}.members USING ({schema}.may_consume(group_name, topic_id));
CREATE POLICY granted ON {schema}.group_losses USING ({schema}.may_consume(group_name, topic_id));
CREATE POLICY granted ON {schema}.event_ids USING ({schema}.may_produce(topic_id));

-- A checkpoint moving backwards is a reset: only the owner's members may (checked only for such moves).
CREATE FUNCTION {schema}.refuse_reset() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to reset the checkpoints of group %', quote_literal(OLD.group_name)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER refuse_reset BEFORE UPDATE ON {schema}.checkpoints
    FOR EACH ROW WHEN (NEW.position < OLD.position) EXECUTE FUNCTION {schema}.refuse_reset();

ALTER FUNCTION {schema}.ensure_segments(integer, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {schema}.analyze_segment(integer, bigint) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- grant_role(role, privilege, topic, group): privilege 'produce' (group ignored), 'consume' or 'admin'
-- (topic and group ignored). revoke_role the same (topic NULL: every topic of the privilege).
CREATE FUNCTION {schema}.grant_role(p_role name, p_privilege text, p_topic text, p_group text) RETURNS void
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
        INSERT INTO {schema}.acl VALUES (p_role, 'consume', v_id, p_group) ON CONFLICT DO NOTHING;
    ELSE
        RAISE EXCEPTION 'unknown privilege %', quote_literal(p_privilege) USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

CREATE FUNCTION {schema}.revoke_role(p_role name, p_privilege text, p_topic text, p_group text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id    integer;
    v_n     integer := 0;
    v_owner name;
    r       record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION 'role % does not exist', quote_ident(p_role) USING ERRCODE = 'undefined_object';
    END IF;
    IF p_privilege = 'admin' THEN
        SELECT r2.rolname INTO v_owner FROM pg_namespace n JOIN pg_roles r2 ON r2.oid = n.nspowner
         WHERE n.nspname = '{schema_raw}';
        IF pg_has_role(p_role, v_owner, 'MEMBER') AND p_role <> v_owner THEN
            EXECUTE format('REVOKE %I FROM %I', v_owner, p_role);
            v_n := 1;
        END IF;
        RETURN v_n;
    END IF;
    IF p_topic IS NOT NULL THEN
        SELECT id INTO v_id FROM {schema}.topics WHERE name = p_topic;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'topic % does not exist', quote_literal(p_topic) USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    FOR r IN DELETE FROM {schema}.acl a
              WHERE a.role_name = p_role AND a.privilege = p_privilege AND (v_id IS NULL OR a.topic_id = v_id)
                AND (p_group IS NULL OR a.group_name = p_group)
          RETURNING a.topic_id LOOP
        v_n := v_n + 1;
        -- the table rights go once no grant of that kind on the topic is left
        IF NOT EXISTS (SELECT 1 FROM {schema}.acl a WHERE a.role_name = p_role AND a.privilege = p_privilege
                                                      AND a.topic_id = r.topic_id) THEN
            IF p_privilege = 'produce' THEN
                EXECUTE format('REVOKE INSERT ON %I.%I FROM %I', '{schema_raw}', 'topic_' || r.topic_id, p_role);
                EXECUTE format('REVOKE SELECT (partition, position, producer) ON %I.%I FROM %I', '{schema_raw}',
                               'topic_' || r.topic_id, p_role);
                EXECUTE format('REVOKE USAGE ON SEQUENCE %I.%I FROM %I', '{schema_raw}',
                               'topic_' || r.topic_id || '_seq', p_role);
            ELSIF NOT EXISTS (SELECT 1 FROM {schema}.acl a WHERE a.role_name = p_role AND a.topic_id = r.topic_id) THEN
                EXECUTE format('REVOKE SELECT ON %I.%I FROM %I', '{schema_raw}', 'topic_' || r.topic_id, p_role);
            END IF;
        END IF;
    END LOOP;
    RETURN v_n;
END;
$$;
