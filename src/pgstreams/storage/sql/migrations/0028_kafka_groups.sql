-- The Kafka gateway's consumer groups (pgstreams.kafka.membership): the classic group protocol's state,
-- kept here so that several gateways over one database serve one group, and any gateway can restart.
--
-- A group has a generation and a state: 'empty' (no member), 'joining' (a rebalance: members rejoin until
-- every member has or the round's deadline passes), 'syncing' (the generation is formed; the leader sends
-- the assignments) and 'stable'. A round counts the rebalances: a member joined the current one when its
-- join_round is the group's round. Members that stop heartbeating for their session timeout are removed.
-- A group's committed offsets are the pgstreams group's checkpoints (the checkpoints table).
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

CREATE TABLE {schema}.kafka_groups (
    group_id      text        PRIMARY KEY,
    generation    integer     NOT NULL DEFAULT 0,
    state         text        NOT NULL DEFAULT 'empty'
                              CHECK (state IN ('empty', 'joining', 'syncing', 'stable')),
    round         integer     NOT NULL DEFAULT 0,
    join_deadline timestamptz,
    protocol_type text,
    protocol      text,
    leader        text,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.kafka_members (
    group_id             text        NOT NULL REFERENCES {schema}.kafka_groups ON DELETE CASCADE,
    member_id            text        NOT NULL,
    client_id            text        NOT NULL DEFAULT '',
    client_host          text        NOT NULL DEFAULT '',
    session_timeout_ms   integer     NOT NULL,
    rebalance_timeout_ms integer     NOT NULL,
    protocol_type        text        NOT NULL,
    protocol_names       text[]      NOT NULL,
    protocol_metadata    bytea[]     NOT NULL,
    join_round           integer     NOT NULL,
    generation           integer,
    assignment           bytea,
    last_seen            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, member_id)
);
