-- The Kafka gateway's idempotent producers (pgstreams.kafka.writes): producer ids and epochs handed out by
-- InitProducerId, and per producer, topic and partition the last batches stored (their first sequence
-- numbers, record counts and first positions, the newest last, at most 5: the batches a producer may have
-- in flight), so that a batch sent again is recognised and stored once.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE TABLE {schema}.kafka_producers (
    producer_id bigserial   PRIMARY KEY,
    epoch       smallint    NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.kafka_sequences (
    producer_id bigint     NOT NULL REFERENCES {schema}.kafka_producers ON DELETE CASCADE,
    topic_id    integer    NOT NULL,
    partition   integer    NOT NULL,
    epoch       smallint   NOT NULL,
    sequences   integer[]  NOT NULL,
    counts      integer[]  NOT NULL,
    positions   bigint[]   NOT NULL,
    PRIMARY KEY (producer_id, topic_id, partition)
);
