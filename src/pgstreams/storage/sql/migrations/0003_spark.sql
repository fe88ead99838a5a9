-- Spark sink bookkeeping (pgstreams.spark): one row per Spark write task whose events are committed.
-- A task inserts its row in the same transaction as its events, so a task that Spark runs again (a retry,
-- a speculative copy, or a micro-batch replayed after a crash) finds the row and publishes nothing twice.
-- sink_id is the streaming query id (stable across restarts from a checkpoint) or a batch write job id.
-- Rows of micro-batches older than the one being committed are deleted as the query advances.
-- Rendered with the target schema as {schema}; literal braces are doubled.

CREATE TABLE {schema}.spark_sink_tasks (
    sink_id        text        NOT NULL,
    batch_id       bigint      NOT NULL,
    task_partition integer     NOT NULL,
    topic_id       integer     NOT NULL REFERENCES {schema}.topics (id) ON DELETE CASCADE,
    events         bigint      NOT NULL DEFAULT 0,
    stored         bigint      NOT NULL DEFAULT 0,
    committed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink_id, batch_id, task_partition)
);
CREATE INDEX spark_sink_tasks_topic_idx ON {schema}.spark_sink_tasks (topic_id);
