-- Named queries: the cluster layout of a shard (0015_cluster.sql). {schema} is the pgstreams schema;
-- values are always bound parameters. Literal braces are doubled.

-- name: cluster_layout
SELECT cluster_id, shard, shards, created_at FROM {schema}.cluster;

-- name: lock_cluster_layout
-- Serialises the layout's changes and a cluster's topic administration on this shard (transaction-level).
SELECT pg_advisory_xact_lock(hashtextextended('pgstreams.cluster:' || %(schema)s::text, 0));

-- name: try_lock_shard
-- A transaction-level lock taken by `cluster init` in a transaction open on every server given at once: a
-- second one on the same database fails, which shows that a database was given twice.
SELECT pg_try_advisory_xact_lock(%s);

-- name: insert_cluster_layout
INSERT INTO {schema}.cluster (cluster_id, shard, shards) VALUES (%s, %s, %s);

-- name: update_cluster_shards
UPDATE {schema}.cluster SET shards = %s WHERE cluster_id = %s;

-- name: next_topic_id
-- The smallest topic id this shard never handed out.
SELECT greatest(coalesce((SELECT max(id) FROM {schema}.topics), 0),
                coalesce(pg_sequence_last_value(pg_get_serial_sequence(format('%%I.topics', %(schema)s::text), 'id')),
                         0)) + 1;

-- name: create_cluster_topic
SELECT topic_id, shards, created FROM {schema}.create_cluster_topic(%s, %s, %s, %s, %s, %s);

-- name: cluster_topic_spans
SELECT t.name, t.id, c.shards FROM {schema}.topics t LEFT JOIN {schema}.cluster_topics c ON c.topic_id = t.id
 ORDER BY t.name;

-- name: cluster_topic_span
SELECT t.id, c.shards FROM {schema}.topics t LEFT JOIN {schema}.cluster_topics c ON c.topic_id = t.id
 WHERE t.name = %s;

-- name: holds_topics
SELECT EXISTS (SELECT FROM {schema}.topics);

-- name: insert_topic_span
INSERT INTO {schema}.cluster_topics (topic_id, shards) VALUES (%s, %s) ON CONFLICT (topic_id) DO NOTHING;
