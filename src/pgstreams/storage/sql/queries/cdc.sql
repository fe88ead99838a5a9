-- Named queries: change data capture (pgstreams.cdc; tables cdc_captures and cdc_tables of migration 0034),
-- the server's logical decoding (settings, rights, publications, replication slots) and the tables it
-- captures. Identifiers ({publication}, {tables}, {table}) are quoted by the caller.

-- name: cdc_server_settings
SELECT current_setting('wal_level'), current_setting('server_version_num')::int,
       r.rolsuper OR r.rolreplication, current_user, current_database()
  FROM pg_roles r WHERE r.rolname = current_user;

-- name: cdc_table_identity
-- A table's kind, replica identity ('d' default, 'i' index, 'f' full, 'n' nothing), the columns of its
-- primary key and those of its replica identity index; no row: no such table.
SELECT c.relkind::text, c.relreplident::text,
       coalesce((SELECT array_agg(a.attname::text ORDER BY k.n)
                   FROM pg_index i
                   CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                  WHERE i.indrelid = c.oid AND i.indisprimary), '{{}}'),
       coalesce((SELECT array_agg(a.attname::text ORDER BY k.n)
                   FROM pg_index i
                   CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
                  WHERE i.indrelid = c.oid AND i.indisreplident), '{{}}')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s;

-- name: cdc_slot_exists
SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND database = current_database();

-- name: cdc_create_slot
SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput');

-- name: cdc_drop_slot
SELECT pg_drop_replication_slot(%s);

-- name: cdc_insert_capture
INSERT INTO {schema}.cdc_captures (name, slot, publication, partitions, snapshot, tombstones, confirmed_lsn)
VALUES (%(name)s, %(slot)s, %(publication)s, %(partitions)s, %(snapshot)s, %(tombstones)s, %(lsn)s::pg_lsn);

-- name: cdc_insert_table
INSERT INTO {schema}.cdc_tables (capture, table_schema, table_name, topic)
VALUES (%s, %s, %s, %s)
ON CONFLICT DO NOTHING;

-- name: cdc_captures
SELECT c.name, c.slot, c.publication, c.partitions, c.snapshot, c.confirmed_lsn::text,
       c.transactions, c.changes, c.created_at, c.confirmed_at,
       coalesce((SELECT array_agg(t.table_schema || '.' || t.table_name ORDER BY t.table_schema, t.table_name)
                   FROM {schema}.cdc_tables t WHERE t.capture = c.name), '{{}}'),
       c.tombstones
  FROM {schema}.cdc_captures c
 WHERE %(name)s::text IS NULL OR c.name = %(name)s
 ORDER BY c.name;

-- name: cdc_capture_tables
SELECT table_schema, table_name, topic FROM {schema}.cdc_tables WHERE capture = %s
 ORDER BY table_schema, table_name;

-- name: cdc_delete_capture
DELETE FROM {schema}.cdc_captures WHERE name = %s RETURNING slot, publication;

-- name: cdc_confirm
-- Store a capture's new position in the transaction of its events, only from the position its capturer
-- read (compare and set): a capturer that lost the capture stores nothing.
UPDATE {schema}.cdc_captures
   SET confirmed_lsn = %(lsn)s::pg_lsn, transactions = transactions + %(transactions)s,
       changes = changes + %(changes)s, confirmed_at = now()
 WHERE name = %(name)s AND confirmed_lsn = %(expected)s::pg_lsn
RETURNING 1;

-- name: cdc_capture_lock
-- The capturer of a capture holds this session lock (one process captures a slot at a time).
SELECT pg_try_advisory_lock(hashtext('pgstreams.cdc'), hashtext(%s));

-- name: cdc_capture_unlock
SELECT pg_advisory_unlock(hashtext('pgstreams.cdc'), hashtext(%s));

-- name: cdc_flush_lsn
SELECT pg_current_wal_flush_lsn()::text;

-- name: cdc_peek
-- The decoded changes of whole source transactions committed before the target position, from the slot's
-- confirmed position on (the slot does not move: see cdc_advance).
SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s,
                                                     'proto_version', '1', 'publication_names', %s);

-- name: cdc_peek_messages
-- cdc_peek with the logical decoding messages too (PostgreSQL 14+): the watermarks of incremental snapshots.
SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s,
                                                     'proto_version', '1', 'publication_names', %s,
                                                     'messages', 'true');

-- name: cdc_log_snapshot
-- Writes the running transactions to the WAL now (PostgreSQL 16+; superusers, or a role granted EXECUTE):
-- the next advance past it moves the slot's restart position, so the next peek decodes less WAL again.
SELECT pg_log_standby_snapshot()::text;

-- name: cdc_advance
SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn);

-- name: cdc_slot_state
-- A capture's slot: whether a process reads it, how far behind the server's WAL it is (bytes), its
-- wal_status and safe_wal_size (PostgreSQL 13+), the WAL position it confirmed.
SELECT s.active, (pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint,
       (pg_current_wal_lsn() - s.restart_lsn)::bigint, s.wal_status, s.safe_wal_size,
       s.confirmed_flush_lsn::text
  FROM pg_replication_slots s WHERE s.slot_name = %s;

-- name: cdc_array_elements
-- The element type of each array type among the given type oids.
SELECT oid::int, typelem::int FROM pg_type WHERE oid = ANY(%s::oid[]) AND typelem <> 0 AND typlen = -1;


-- name: cdc_table_columns
-- A table's columns as a Relation message names them: name and type oid.
SELECT a.attname::text, a.atttypid::int
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum;

-- name: cdc_emit_message
-- A transactional logical decoding message (decoded by pgoutput with messages 'true', PostgreSQL 14+): the
-- watermarks and requests of incremental snapshots, seen by the capture in its stream, in commit order.
SELECT pg_logical_emit_message(true, %s, %s)::text;

-- name: cdc_current_snapshot
-- The transaction's snapshot (xmin:xmax:xip,...): which source transactions a chunk's read saw.
SELECT pg_current_snapshot()::text;

-- name: cdc_snapshot_forget
DELETE FROM {schema}.cdc_snapshots WHERE capture = %s AND table_schema = %s AND table_name = %s;

-- name: cdc_snapshot_request
-- An incremental snapshot of a captured table, from its first key on (cdc_snapshot_forget first: a
-- table snapshotted again starts over, under a new id).
INSERT INTO {schema}.cdc_snapshots (capture, table_schema, table_name, chunk_size)
VALUES (%s, %s, %s, %s);

-- name: cdc_snapshot_next
-- The incremental snapshot a capture works on next (the oldest unfinished).
SELECT id, table_schema, table_name, chunk_size, last_key
  FROM {schema}.cdc_snapshots
 WHERE capture = %s AND finished_at IS NULL
 ORDER BY id
 LIMIT 1;

-- name: cdc_snapshot_progress
-- A chunk stored (in the transaction of its events): the snapshot's cursor moves past it; the last chunk
-- (shorter than chunk_size) finishes it. No row: the snapshot was requested again meanwhile.
UPDATE {schema}.cdc_snapshots
   SET last_key = coalesce(%(last_key)s::text[], last_key), rows = rows + %(rows)s, chunks = chunks + 1,
       finished_at = CASE WHEN %(finished)s THEN now() END
 WHERE id = %(id)s
RETURNING 1;

-- name: cdc_snapshots
-- The incremental snapshots of a capture (or of every capture), by table.
SELECT capture, table_schema, table_name, chunk_size, rows, chunks, requested_at, finished_at
  FROM {schema}.cdc_snapshots
 WHERE %(capture)s::text IS NULL OR capture = %(capture)s
 ORDER BY capture, table_schema, table_name;
