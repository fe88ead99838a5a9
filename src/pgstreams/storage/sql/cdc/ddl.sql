-- Queries of change data capture rendered with identifiers of their own, quoted by the caller
-- (pgstreams.storage.cdc: {publication}, {tables}, {table}, {columns}) or a quoted literal ({snapshot}):
-- a query set of their own (CDC_QUERIES), as the core query sets have no such placeholders.

-- name: cdc_create_publication
CREATE PUBLICATION {publication} FOR TABLE {tables};

-- name: cdc_publication_add
ALTER PUBLICATION {publication} ADD TABLE {tables};

-- name: cdc_drop_publication
DROP PUBLICATION IF EXISTS {publication};

-- name: cdc_snapshot_read
-- A table's rows, each column as text (the form the decoder reads), in the caller's snapshot.
SELECT {columns} FROM {table};

-- name: cdc_begin_snapshot
-- The first statement of the transaction (autocommit off) in which a snapshot's rows are read; then
-- cdc_set_snapshot, before any query.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: cdc_set_snapshot
SET TRANSACTION SNAPSHOT {snapshot};

-- name: cdc_chunk_read
-- A chunk of an incremental snapshot: the next rows by key (the key columns; after the first chunk, those
-- after the last key read, its values bound), each column as text, in the caller's snapshot. The order is
-- by the columns of the table (row.key), not by the output columns of the same names (their text).
SELECT {columns} FROM {table} AS row {after} ORDER BY {order} LIMIT %s;
