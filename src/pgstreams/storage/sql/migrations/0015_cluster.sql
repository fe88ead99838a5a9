-- Shards: one logical cluster over several PostgreSQL servers (docs/shards.md).
--
-- Every shard records the cluster's layout: the cluster id, its own place in the shard order and the
-- names of every shard (user@host:port/dbname, never a password) in that order. A cluster client checks
-- at connect that the servers it was given are exactly these shards, in this order.
--
-- A topic of a cluster exists on every shard with the same id, partitions and configuration; it records
-- the number of shards it was created with (its span): its events (keyed and keyless) go to the first
-- `shards` shards only, so a shard added later never moves an existing topic's keys.
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE TABLE {schema}.cluster (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    cluster_id uuid        NOT NULL,
    shard      integer     NOT NULL CHECK (shard >= 0),
    shards     text[]      NOT NULL CHECK (cardinality(shards) >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (shard < cardinality(shards))
);

CREATE TABLE {schema}.cluster_topics (
    topic_id integer PRIMARY KEY REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    shards   integer NOT NULL CHECK (shards >= 1)
);

-- The layout is no secret: every role that may use the schema reads it (connecting checks it).
GRANT SELECT ON {schema}.cluster, {schema}.cluster_topics TO PUBLIC;

-- Create a topic of a cluster on this shard with the id the cluster chose (the same on every shard), in
-- one transaction: its row, its storage and its span. Idempotent: when a topic of that name exists
-- already, nothing changes and its id and span are returned (the caller compares them), so a creation
-- that stopped half-way over the shards can be run again. The topics' identity sequence is moved past
-- the id, so a later single-server creation never takes it.
CREATE FUNCTION {schema}.create_cluster_topic(p_id integer, p_name text, p_partitions integer,
                                              p_segment_size bigint, p_config jsonb, p_shards integer)
RETURNS TABLE (topic_id integer, shards integer, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
BEGIN
    SELECT t.id INTO v_id FROM {schema}.topics t WHERE t.name = p_name;
    IF v_id IS NOT NULL THEN
        RETURN QUERY SELECT v_id, (SELECT c.shards FROM {schema}.cluster_topics c WHERE c.topic_id = v_id),
                            false;
        RETURN;
    END IF;
    INSERT INTO {schema}.topics (id, name, partitions, segment_size, config)
        OVERRIDING SYSTEM VALUE VALUES (p_id, p_name, p_partitions, p_segment_size, p_config);
    PERFORM setval(pg_get_serial_sequence(format('%I.topics', '{schema_raw}'), 'id'),
                   greatest(p_id, (SELECT max(id) FROM {schema}.topics)));
    PERFORM {schema}.create_topic_storage(p_id);
    INSERT INTO {schema}.cluster_topics (topic_id, shards) VALUES (p_id, p_shards);
    RETURN QUERY SELECT p_id, p_shards, true;
END;
$$;
