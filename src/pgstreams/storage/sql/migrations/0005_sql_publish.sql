-- Publishing from SQL: {schema}.publish(topic, value, ...) stores one event exactly as the Python
-- producer does (same partitioner, validation, idempotent event ids, read-fence registration, wake-up),
-- inside the caller's transaction. Usable from any language and from triggers (a transactional outbox).
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

-- Kafka's 32-bit murmur2 (seed 0x9747b28c) of some bytes, as a signed 32-bit integer: the same as
-- pgstreams.partitioner.murmur2. Unsigned 32-bit arithmetic in bigint: a product of two values below
-- 2^32 and 2^31 stays below 2^63, and every step is masked back to 32 bits.
CREATE FUNCTION {schema}.murmur2(p_data bytea) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    c_m    constant bigint := 1540483477;  -- 0x5bd1e995
    c_mask constant bigint := 4294967295;  -- 0xffffffff
    v_len  integer := length(p_data);
    v_n4   integer := v_len / 4 * 4;
    v_h    bigint := (2538058380 # v_len) & 4294967295;  -- seed 0x9747b28c xor length
    v_k    bigint;
    v_i    integer := 0;
BEGIN
    WHILE v_i < v_n4 LOOP
        v_k := get_byte(p_data, v_i)::bigint | (get_byte(p_data, v_i + 1)::bigint << 8)
               | (get_byte(p_data, v_i + 2)::bigint << 16) | (get_byte(p_data, v_i + 3)::bigint << 24);
        v_k := (v_k * c_m) & c_mask;
        v_k := v_k # (v_k >> 24);
        v_k := (v_k * c_m) & c_mask;
        v_h := ((v_h * c_m) & c_mask) # v_k;
        v_i := v_i + 4;
    END LOOP;
    IF v_len - v_n4 = 3 THEN
        v_h := v_h # (get_byte(p_data, v_n4 + 2)::bigint << 16);
    END IF;
    IF v_len - v_n4 >= 2 THEN
        v_h := v_h # (get_byte(p_data, v_n4 + 1)::bigint << 8);
    END IF;
    IF v_len - v_n4 >= 1 THEN
        v_h := v_h # get_byte(p_data, v_n4)::bigint;
        v_h := (v_h * c_m) & c_mask;
    END IF;
    v_h := v_h # (v_h >> 13);
    v_h := (v_h * c_m) & c_mask;
    v_h := v_h # (v_h >> 15);
    RETURN (CASE WHEN v_h >= 2147483648 THEN v_h - 4294967296 ELSE v_h END)::integer;
END;
$$;

-- The partition of a key in a topic of p_partitions partitions: (murmur2(utf8(key)) & 0x7fffffff) mod
-- p_partitions, as pgstreams.partition_for_key and Kafka's default partitioner. STABLE: the UTF-8 bytes
-- come from the database's encoding.
CREATE FUNCTION {schema}.partition_for_key(p_key text, p_partitions integer) RETURNS integer
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT ({schema}.murmur2(convert_to(p_key, 'UTF8')) & 2147483647) % p_partitions;
$$;

-- Where publish() stored an event; duplicate when its event_id existed (the first copy's place).
CREATE TYPE {schema}.publish_result AS (partition integer, position bigint, duplicate boolean);

-- Publish one event whose value is already encoded (p_kind: 'b' bytes, 's' UTF-8 text, 'j' UTF-8 JSON;
-- see pgstreams.codec). The publish() overloads call it; every check comes before anything is drawn or
-- written, so a refused event changes nothing.
--
-- The event's position is drawn with next_position(), which first registers the transaction as a
-- publisher of the partition (0004_partition_fence.sql): readers of that partition stop below it until
-- the transaction ends. The segment holding the position is created if missing (in this transaction);
-- when the position comes within one segment of the last one, the next segment is created ahead unless
-- another transaction is creating segments of the topic at that moment, so publishers rarely wait.
CREATE FUNCTION {schema}.publish_encoded(
    p_topic text, p_kind "char", p_payload bytea, p_key text, p_headers jsonb, p_event_type text,
    p_partition integer, p_event_id text, p_correlation_id text, p_causation_id text, p_notify boolean
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    v_id      integer;
    v_parts   integer;
    v_size    bigint;
    v_bad     record;
    v_headers jsonb := p_headers;
    v_rr      text;
    v_seq     regclass;
    v_end     bigint;
    v_off     bigint;
    r         {schema}.publish_result;
BEGIN
    -- the topic
    IF p_topic IS NULL THEN
        RAISE EXCEPTION 'topic name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF p_topic !~ '^[A-Za-z0-9._-]{{1,249}}$' OR p_topic IN ('.', '..') THEN
        RAISE EXCEPTION 'invalid topic name %: use 1 to 249 characters of [A-Za-z0-9._-]', quote_literal(p_topic)
            USING ERRCODE = 'invalid_name';
    END IF;
    SELECT t.id, t.partitions, t.segment_size INTO v_id, v_parts, v_size
      FROM {schema}.topics t WHERE t.name = p_topic;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'topic % does not exist', quote_literal(p_topic) USING ERRCODE = 'no_data_found';
    END IF;
    -- the event
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'value must not be NULL (a JSON null is ''null''::jsonb)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF v_headers IS NOT NULL THEN
        IF jsonb_typeof(v_headers) = 'null' THEN
            v_headers := NULL;
        ELSIF jsonb_typeof(v_headers) <> 'object' THEN
            RAISE EXCEPTION 'headers must be a JSON object of string values, not a JSON %', jsonb_typeof(v_headers)
                USING ERRCODE = 'invalid_parameter_value';
        ELSE
            SELECT h.key, h.value INTO v_bad FROM jsonb_each(v_headers) h
             WHERE jsonb_typeof(h.value) <> 'string' LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'headers must map strings to strings; bad entry %: % (a JSON %)',
                                to_jsonb(v_bad.key), v_bad.value, jsonb_typeof(v_bad.value)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF v_headers = '{{}}'::jsonb THEN
                v_headers := NULL;  -- as the Python producer stores no headers
            END IF;
        END IF;
    END IF;
    IF coalesce(p_event_type, p_event_id, p_correlation_id, p_causation_id) IS NOT NULL THEN
        SELECT f.name, char_length(f.text) AS length INTO v_bad
          FROM (VALUES (1, 'event_type', p_event_type), (2, 'event_id', p_event_id),
                       (3, 'correlation_id', p_correlation_id), (4, 'causation_id', p_causation_id))
               AS f(i, name, text)
         WHERE char_length(f.text) NOT BETWEEN 1 AND 1000
         ORDER BY f.i LIMIT 1;
        IF FOUND THEN  -- as the Python producer: 1 to 1000 characters
            RAISE EXCEPTION '% must have 1 to 1000 characters, got %', v_bad.name, v_bad.length
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF p_notify IS NULL THEN
        RAISE EXCEPTION 'notify must be true or false, not NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- the partition: given, else the key's, else round-robin per session and topic from a random start
    IF p_partition IS NOT NULL THEN
        IF p_partition < 0 OR p_partition >= v_parts THEN
            RAISE EXCEPTION 'partition % out of range for topic % (0 to %)', p_partition,
                            quote_literal(p_topic), v_parts - 1
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        r.partition := p_partition;
    ELSIF p_key IS NOT NULL THEN
        r.partition := {schema}.partition_for_key(p_key, v_parts);
    ELSE
        v_rr := nullif(current_setting('pgstreams.round_robin_' || v_id, true), '');
        r.partition := coalesce(v_rr::integer + 1, floor(random() * v_parts)::integer) % v_parts;
        PERFORM set_config('pgstreams.round_robin_' || v_id, r.partition::text, false);
    END IF;
    -- the position (registering the transaction with the partition's read fence first)
    v_seq := format('%I.%I', '{schema_raw}', 'topic_' || v_id || '_seq')::regclass;
    r.position := {schema}.next_position(v_id, r.partition, v_seq);
    r.duplicate := false;
    IF p_event_id IS NOT NULL THEN
        INSERT INTO {schema}.event_ids (topic_id, event_id, partition, position)
        VALUES (v_id, p_event_id, r.partition, r.position)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT i.partition, i.position INTO r.partition, r.position
              FROM {schema}.event_ids i WHERE i.topic_id = v_id AND i.event_id = p_event_id;
            IF NOT FOUND THEN  -- the conflicting row vanished: the topic was deleted meanwhile
                RAISE EXCEPTION 'topic % changed while publishing', quote_literal(p_topic)
                    USING ERRCODE = 'no_data_found';
            END IF;
            r.duplicate := true;
            RETURN r;
        END IF;
    END IF;
    -- the segment holding the position, and one ahead
    SELECT s.hi INTO v_end FROM {schema}.segments s WHERE s.topic_id = v_id ORDER BY s.segment DESC LIMIT 1;
    IF r.position >= coalesce(v_end, 0) THEN
        PERFORM {schema}.ensure_segments(v_id, r.position + v_size);
    ELSIF r.position + v_size >= v_end THEN
        IF pg_try_advisory_xact_lock(hashtext('pgstreams.segments'), v_id) THEN  -- ensure_segments' lock
            PERFORM {schema}.ensure_segments(v_id, r.position + v_size);
        END IF;
    END IF;
    EXECUTE format('INSERT INTO %I.%I (partition, position, kind, key, value, headers, event_type, event_id,'
                   ' correlation_id, causation_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)',
                   '{schema_raw}', 'topic_' || v_id)
      USING r.partition, r.position, p_kind, p_key, p_payload, v_headers, p_event_type, p_event_id,
            p_correlation_id, p_causation_id;
    -- column statistics of a new segment once it holds enough rows (see analyze_segment), tried at
    -- every 512th position
    v_off := r.position % v_size;
    IF v_off % 512 = 0 AND v_off >= least(1000, v_size / 2) THEN
        PERFORM {schema}.analyze_segment(v_id, r.position);
    END IF;
    IF p_notify THEN
        PERFORM pg_notify('pgstreams.{schema_raw}', v_id::text);
    END IF;
    RETURN r;
END;
$$;

-- publish(topic, value, ...): three overloads by the value's type, stored so that consumers get the
-- same type back as from the Python producer: jsonb as JSON (kind 'j', its text form), text as a string
-- (kind 's'), bytea as bytes (kind 'b'). A quoted literal of no declared type resolves to text: write
-- '{{"a": 1}}'::jsonb for JSON and '\x00ff'::bytea for bytes.
CREATE FUNCTION {schema}.publish(
    topic text, value jsonb, key text DEFAULT NULL, headers jsonb DEFAULT NULL, event_type text DEFAULT NULL,
    "partition" integer DEFAULT NULL, event_id text DEFAULT NULL, correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL, notify boolean DEFAULT true
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {schema}.publish_encoded($1, 'j', convert_to($2::text, 'UTF8'), $3, $4, $5, $6, $7, $8, $9, $10);
END;
$$;

CREATE FUNCTION {schema}.publish(
    topic text, value text, key text DEFAULT NULL, headers jsonb DEFAULT NULL, event_type text DEFAULT NULL,
    "partition" integer DEFAULT NULL, event_id text DEFAULT NULL, correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL, notify boolean DEFAULT true
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {schema}.publish_encoded($1, 's', convert_to($2, 'UTF8'), $3, $4, $5, $6, $7, $8, $9, $10);
END;
$$;

CREATE FUNCTION {schema}.publish(
    topic text, value bytea, key text DEFAULT NULL, headers jsonb DEFAULT NULL, event_type text DEFAULT NULL,
    "partition" integer DEFAULT NULL, event_id text DEFAULT NULL, correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL, notify boolean DEFAULT true
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {schema}.publish_encoded($1, 'b', $2, $3, $4, $5, $6, $7, $8, $9, $10);
END;
$$;
