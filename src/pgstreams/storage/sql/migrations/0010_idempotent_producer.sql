-- Idempotent producers by default, with state per producer, not per event (as Kafka's producer id and
-- sequence number).
--
-- Every client draws a producer id once (new_producer_id()), and tags each event it publishes outside a
-- caller's transaction with (producer id << 32) | (its sequence number mod 2^32), in the event row's own
-- column "producer" (8 bytes of the row, no other write). When a publish fails because the connection
-- broke, its outcome is unknown: the client then retries on a fresh connection, but first waits until
-- the old session ended and looks for its tag in the event's partitions above the last position it knew
-- before the attempt (a range of the read index); only if absent does it store the event again. Events
-- of a caller's transaction (conn=), of Spark writes and of the SQL publish() function are not tagged:
-- their transaction is the caller's to retry.
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE SEQUENCE {schema}.producer_ids AS bigint MINVALUE 1 MAXVALUE 2147483647 CYCLE;

CREATE FUNCTION {schema}.new_producer_id() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT nextval(format('%I.producer_ids', '{schema_raw}')::regclass);
$$;

DO $$
DECLARE
    v_id integer;
BEGIN
    FOR v_id IN SELECT id FROM {schema}.topics ORDER BY id LOOP
        EXECUTE format('ALTER TABLE %I.%I ADD COLUMN IF NOT EXISTS producer bigint', '{schema_raw}',
                       'topic_' || v_id);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.create_topic_storage(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_table text := 'topic_' || p_topic_id;
    v_size  bigint;
BEGIN
    SELECT segment_size INTO v_size FROM {schema}.topics WHERE id = p_topic_id;
    EXECUTE format('CREATE SEQUENCE %I.%I AS bigint START 1 CACHE 1', '{schema_raw}', v_table || '_seq');
    EXECUTE format($f$
        CREATE TABLE %1$I.%2$I (
            partition      integer     NOT NULL,
            position       bigint      NOT NULL DEFAULT nextval(%3$L::regclass),
            xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
            created_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
            kind           "char"      NOT NULL,
            key            text,
            value          bytea       NOT NULL,
            headers        jsonb,
            event_type     text,
            event_id       text,
            correlation_id text,
            causation_id   text,
            producer       bigint
        ) PARTITION BY RANGE (position)$f$,
        '{schema_raw}', v_table, quote_ident('{schema_raw}') || '.' || quote_ident(v_table || '_seq'));
    EXECUTE format('CREATE INDEX %I ON %I.%I (partition, position)',
                   v_table || '_read_idx', '{schema_raw}', v_table);
    RETURN {schema}.ensure_segments(p_topic_id, v_size);
END;
$$;
