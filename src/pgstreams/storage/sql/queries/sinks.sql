-- Named queries: sinks. Bookkeeping of writers that must store a unit of work once (the Spark data
-- source's write tasks, table spark_sink_tasks of migration 0003): a task claims its row in the same
-- transaction as its events, so a task run again finds the row and stores nothing twice.

-- name: claim_sink_task
INSERT INTO {schema}.spark_sink_tasks (sink_id, batch_id, task_partition, topic_id)
VALUES (%s, %s, %s, %s)
ON CONFLICT DO NOTHING
RETURNING 1;

-- name: record_sink_task
UPDATE {schema}.spark_sink_tasks SET events = %s, stored = %s
 WHERE sink_id = %s AND batch_id = %s AND task_partition = %s;

-- name: forget_sink_batches_before
DELETE FROM {schema}.spark_sink_tasks WHERE sink_id = %s AND batch_id < %s;

-- name: forget_sink
DELETE FROM {schema}.spark_sink_tasks WHERE sink_id = %s;
