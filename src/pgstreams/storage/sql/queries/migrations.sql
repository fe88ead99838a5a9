-- Named queries of the migration runner (pgstreams.storage.migrations), shared by every namespace that
-- keeps numbered migrations in a schema of its own: {schema} is that schema.

-- name: migration_lock
SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s));

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_table_exists
SELECT to_regclass(format('%%I.migrations', %s::text)) IS NOT NULL;

-- name: applied_migrations
SELECT version, name, applied_at FROM {schema}.migrations;

-- name: migration_done
SELECT 1 FROM {schema}.migrations WHERE version = %s;

-- name: record_migration
INSERT INTO {schema}.migrations (version, name) VALUES (%s, %s);

-- name: unknown_migrations
SELECT version FROM {schema}.migrations WHERE version <> ALL(%s) ORDER BY version;

-- name: drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE;
