-- Share groups: an all-or-nothing ack of whole batch rows, for exactly-once transactions.
--
-- share_ack_batches_all() deletes the batch rows given (partition, first position, every position), held by
-- the owner with an unexpired lock, like the named query share_ack_batches, but raises (SQLSTATE PSA01)
-- unless every one of them was still held, so that the transaction it runs in (the handler's writes, the
-- COMMIT sent in the same round trip) is rolled back. ShareConsumer.transaction() then learns which acks
-- failed with the ordinary settle in a transaction it rolls back.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE FUNCTION {schema}.share_ack_batches_all(p_group text, p_topic_id integer, p_owner text,
                                               p_partitions integer[], p_firsts bigint[], p_batches text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM {schema}.share_events s
     USING unnest(p_partitions, p_firsts, p_batches) AS c(partition, first, batch)
     WHERE s.group_name = p_group AND s.topic_id = p_topic_id AND s.partition = c.partition
       AND s.position = c.first AND s.state = 'b' AND s.owner = p_owner AND s.until > clock_timestamp()
       AND s.batch = c.batch::bigint[];
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n <> coalesce(cardinality(p_partitions), 0) THEN
        RAISE EXCEPTION 'share group %: % of % acked batches were no longer held by %', p_group,
              coalesce(cardinality(p_partitions), 0) - v_n, coalesce(cardinality(p_partitions), 0), p_owner
              USING ERRCODE = 'PSA01';
    END IF;
    RETURN v_n;
END $$;
