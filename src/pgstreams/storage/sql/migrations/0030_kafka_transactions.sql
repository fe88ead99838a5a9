-- The Kafka gateway's transactional producers (pgstreams.kafka.transactions): a transactional id names one
-- producer id, whose epoch goes up each time a producer initialises with that id (an older epoch is then
-- fenced). A transaction's records and offsets are written in one PostgreSQL transaction that stays open
-- until EndTxn: read-committed consumers see them at its commit, and an abort leaves nothing.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.kafka_producers ADD COLUMN transactional_id text UNIQUE;
