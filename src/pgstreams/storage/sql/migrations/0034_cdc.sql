-- Change data capture (pgstreams.cdc): a capture turns the changes of chosen tables of this database into
-- events, read from a logical replication slot of its own (plugin pgoutput) through a publication of its
-- own. confirmed_lsn is the end of the last source transaction whose events are stored: it is written in
-- the same transaction as those events, so a capture that restarts skips every transaction at or below
-- it (the slot itself is advanced afterwards and may lag behind it).
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE TABLE {schema}.cdc_captures (
    name          text PRIMARY KEY,            -- the topic prefix of its events
    slot          text NOT NULL UNIQUE,        -- the logical replication slot it reads
    publication   text NOT NULL UNIQUE,        -- the publication naming its tables
    partitions    integer NOT NULL CHECK (partitions > 0),
    snapshot      text NOT NULL CHECK (snapshot IN ('initial', 'never')),
    tombstones    boolean NOT NULL DEFAULT false,  -- an event with a null value after each delete
    confirmed_lsn pg_lsn NOT NULL,
    transactions  bigint NOT NULL DEFAULT 0,   -- source transactions stored
    changes       bigint NOT NULL DEFAULT 0,   -- events stored (snapshot rows included)
    created_at    timestamptz NOT NULL DEFAULT now(),
    confirmed_at  timestamptz
);

CREATE TABLE {schema}.cdc_tables (
    capture      text NOT NULL REFERENCES {schema}.cdc_captures (name) ON DELETE CASCADE,
    table_schema text NOT NULL,
    table_name   text NOT NULL,
    topic        text NOT NULL,
    added_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (capture, table_schema, table_name)
);
