-- The Kafka gateway's consumer groups (0028_kafka_groups.sql; pgstreams.kafka.membership).

-- name: kafka_group_lock
-- The group's row, created when absent, locked for the transaction.
WITH made AS (
    INSERT INTO {schema}.kafka_groups (group_id) VALUES (%s) ON CONFLICT (group_id) DO NOTHING
)
SELECT 1;

-- name: kafka_group_row
SELECT generation, state, round, join_deadline <= now(), protocol_type, protocol, leader,
       GREATEST(0, EXTRACT(EPOCH FROM join_deadline - now()))
  FROM {schema}.kafka_groups WHERE group_id = %s FOR UPDATE;

-- name: kafka_expire_members
-- Remove the members whose session timed out; their ids.
DELETE FROM {schema}.kafka_members
 WHERE group_id = %s AND last_seen < now() - make_interval(secs => session_timeout_ms / 1000.0)
RETURNING member_id;

-- name: kafka_members
SELECT member_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms, protocol_type,
       protocol_names, protocol_metadata, join_round, generation, assignment
  FROM {schema}.kafka_members WHERE group_id = %s ORDER BY member_id;

-- name: kafka_member_upsert
INSERT INTO {schema}.kafka_members AS m (group_id, member_id, client_id, client_host, session_timeout_ms,
       rebalance_timeout_ms, protocol_type, protocol_names, protocol_metadata, join_round)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (group_id, member_id) DO UPDATE
   SET client_id = excluded.client_id, client_host = excluded.client_host,
       session_timeout_ms = excluded.session_timeout_ms, rebalance_timeout_ms = excluded.rebalance_timeout_ms,
       protocol_type = excluded.protocol_type, protocol_names = excluded.protocol_names,
       protocol_metadata = excluded.protocol_metadata, join_round = excluded.join_round, last_seen = now();

-- name: kafka_member_seen
UPDATE {schema}.kafka_members SET last_seen = now() WHERE group_id = %s AND member_id = %s
RETURNING generation;

-- name: kafka_member_delete
DELETE FROM {schema}.kafka_members WHERE group_id = %s AND member_id = ANY(%s) RETURNING member_id;

-- name: kafka_members_drop_stale
-- End of a round: the members that did not rejoin it leave the group.
DELETE FROM {schema}.kafka_members WHERE group_id = %s AND join_round < %s;

-- name: kafka_members_generation
UPDATE {schema}.kafka_members SET generation = %s, assignment = NULL WHERE group_id = %s;

-- name: kafka_member_assign
UPDATE {schema}.kafka_members SET assignment = c.a
  FROM unnest(%s::text[], %s::bytea[]) AS c(m, a)
 WHERE group_id = %s AND member_id = c.m;

-- name: kafka_group_update
UPDATE {schema}.kafka_groups
   SET generation = %s, state = %s, round = %s, join_deadline = now() + make_interval(secs => %s),
       protocol_type = %s, protocol = %s, leader = %s, updated_at = now()
 WHERE group_id = %s;

-- name: kafka_groups_list
SELECT group_id, state, protocol_type, protocol FROM {schema}.kafka_groups ORDER BY group_id;

-- name: kafka_producer_new
INSERT INTO {schema}.kafka_producers DEFAULT VALUES RETURNING producer_id, epoch;

-- name: kafka_producer_bump
-- A producer starts a new epoch (InitProducerId with its id and current epoch).
UPDATE {schema}.kafka_producers SET epoch = epoch + 1
 WHERE producer_id = %s AND epoch = %s RETURNING producer_id, epoch;

-- name: kafka_producer_epoch
-- The producer's current epoch, its row locked: its batches are stored one at a time.
SELECT epoch FROM {schema}.kafka_producers WHERE producer_id = %s FOR UPDATE;

-- name: kafka_sequences_get
-- The producer's last batches on a partition, locked for the transaction that stores the next one.
SELECT epoch, sequences, counts, positions FROM {schema}.kafka_sequences
 WHERE producer_id = %s AND topic_id = %s AND partition = %s FOR UPDATE;

-- name: kafka_sequences_put
INSERT INTO {schema}.kafka_sequences AS s (producer_id, topic_id, partition, epoch, sequences, counts, positions)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (producer_id, topic_id, partition) DO UPDATE
   SET epoch = excluded.epoch, sequences = excluded.sequences, counts = excluded.counts,
       positions = excluded.positions;

-- name: kafka_txn_producer
-- A transactional producer initialises: the producer id of its transactional id (new, epoch 0), or the
-- same id with the next epoch, which fences the producers of earlier epochs.
INSERT INTO {schema}.kafka_producers AS p (transactional_id) VALUES (%s)
ON CONFLICT (transactional_id) DO UPDATE SET epoch = mod(p.epoch + 1, 32767)
RETURNING producer_id, epoch;

-- name: kafka_txn_of
-- The producer id and current epoch of a transactional id.
SELECT producer_id, epoch FROM {schema}.kafka_producers WHERE transactional_id = %s;

-- name: kafka_txn_hold
-- A transaction of a producer begins: its current epoch, its row held (shared) until the transaction
-- ends, so that a producer initialising with the same transactional id elsewhere waits for it.
SELECT epoch FROM {schema}.kafka_producers WHERE producer_id = %s FOR SHARE;
