-- Incremental snapshots of captured tables (pgstreams.cdc.snapshots): a table's rows re-read in chunks of
-- its key while the capture streams, each chunk bracketed in the capture's stream by two logical decoding
-- messages (a low and a high watermark). last_key is the key of the last row of the last chunk stored,
-- written in the transaction that stores that chunk's events: a capture that restarts reads the next
-- chunk after it, and a chunk whose events were not stored is read again.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE TABLE {schema}.cdc_snapshots (
    id           bigserial PRIMARY KEY,
    capture      text NOT NULL,
    table_schema text NOT NULL,
    table_name   text NOT NULL,
    chunk_size   integer NOT NULL CHECK (chunk_size > 0),
    last_key     text[],                       -- the key columns' text of the last row stored; NULL: none yet
    rows         bigint NOT NULL DEFAULT 0,    -- snapshot rows stored (op r)
    chunks       bigint NOT NULL DEFAULT 0,    -- chunks done
    requested_at timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,                  -- NULL while chunks remain
    UNIQUE (capture, table_schema, table_name),
    FOREIGN KEY (capture, table_schema, table_name)
        REFERENCES {schema}.cdc_tables (capture, table_schema, table_name) ON DELETE CASCADE
);
