-- max.message.bytes enforced by the SQL publish() function (and available to every other writer, such as
-- the Spark data source): max_message_bytes(config) is a topic's limit, the stored value or the default of
-- pgstreams.topicconfig.TOPIC_CONFIG_DEFAULTS (a test keeps the two equal). publish_encoded() is
-- 0005_sql_publish.sql's with the size check added before anything is drawn or written: an event larger
-- than the limit raises program_limit_exceeded (SQLSTATE 54000) and stores nothing. Rendered with the
-- target schema as {schema}; literal braces are doubled.

CREATE FUNCTION {schema}.max_message_bytes(p_config jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((p_config ->> 'max.message.bytes')::bigint, 1048588);
$$;

CREATE OR REPLACE FUNCTION {schema}.publish_encoded(
    p_topic text, p_kind "char", p_payload bytea, p_key text, p_headers jsonb, p_event_type text,
    p_partition integer, p_event_id text, p_correlation_id text, p_causation_id text, p_notify boolean
) RETURNS {schema}.publish_result
LANGUAGE plpgsql AS $$
DECLARE
    v_id      integer;
    v_parts   integer;
    v_size    bigint;
    v_max     bigint;
    v_bytes   bigint;
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
    SELECT t.id, t.partitions, t.segment_size, {schema}.max_message_bytes(t.config) INTO v_id, v_parts, v_size, v_max
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
    -- the size max.message.bytes limits: value as stored, key, header names and values (UTF-8 bytes)
    v_bytes := octet_length(p_payload) + coalesce(octet_length(p_key), 0);
    IF v_headers IS NOT NULL THEN
        v_bytes := v_bytes + (SELECT coalesce(sum(octet_length(h.key) + octet_length(h.value)), 0)
                                FROM jsonb_each_text(v_headers) h);
    END IF;
    IF v_bytes > v_max THEN
        RAISE EXCEPTION 'event of % bytes exceeds max.message.bytes (%) of topic %; nothing was stored',
                        v_bytes, v_max, quote_literal(p_topic)
            USING ERRCODE = 'program_limit_exceeded';
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
