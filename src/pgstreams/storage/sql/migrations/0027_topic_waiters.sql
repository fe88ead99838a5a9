-- Wake-up notifications only where a consumer waits for them.
--
-- A publishing client sends a coalesced pg_notify after its commits (storage/notifications.py). Each is a
-- transaction of its own whose commit takes the cluster-wide notification lock; from several publishing
-- processes they cost more server time than the inserts they announce leave to spare. When no consumer of a
-- topic is waiting, nobody needs them.
--
-- A client whose consumer (or worker, or share consumer) is about to wait for a topic's events records
-- that here with topic_waiting(): the topic has a waiter until "until" (now + p_ttl_s, kept by the client
-- while it keeps waiting). A publishing client reads whether a topic has a waiter with the topic's row,
-- which it reads again at least every 0.5 s (producer.TOPIC_CHECK_INTERVAL), and sends no notification
-- for that topic until its next reading when none waits. A consumer that starts waiting after its mark
-- may have lapsed polls quickly for longer than that interval (consumer/wakeup.py), so events published
-- by a client that has not yet seen its mark reach it as fast.
--
-- The table holds hints only: a lost row costs a waiter latency until its client marks the topic again,
-- never an event. It is logged (it survives a crash) and written at most every few seconds per waiting
-- client and topic, with an asynchronous commit.
CREATE TABLE {schema}.topic_waiters (
    topic_id integer     PRIMARY KEY,
    until    timestamptz NOT NULL
);
GRANT SELECT ON {schema}.topic_waiters TO PUBLIC;

-- Mark topic p_topic_id as waited for, for p_ttl_s seconds from now (a later mark is kept). Runs as the
-- schema's owner: any role that may use the schema may say that it waits (the row reveals nothing and
-- only makes publishers notify).
CREATE FUNCTION {schema}.topic_waiting(p_topic_id integer, p_ttl_s double precision) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- a hint: the caller's wait need not wait for the flush of its commit
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO {schema}.topic_waiters AS w (topic_id, until)
    VALUES (p_topic_id, now() + make_interval(secs => p_ttl_s))
    ON CONFLICT (topic_id) DO UPDATE SET until = GREATEST(w.until, EXCLUDED.until);
END;
$$;
