-- Tables of the ML reference application. {schema} is the application's schema (a quoted identifier).

-- Enrichment store: current rows, read by key by the online scorer.
CREATE TABLE {schema}.users (
    user_id      text PRIMARY KEY,
    age          integer NOT NULL,
    country      text NOT NULL,
    fav_category text NOT NULL,
    activity     double precision NOT NULL,
    valid_from   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    version      integer NOT NULL DEFAULT 1
);

CREATE TABLE {schema}.ads (
    ad_id      text PRIMARY KEY,
    advertiser text NOT NULL,
    category   text NOT NULL,
    price      double precision NOT NULL,
    quality    double precision NOT NULL,
    valid_from timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    version    integer NOT NULL DEFAULT 1
);

-- Every version, for point-in-time lookups by the join pipeline.
CREATE TABLE {schema}.user_history (
    user_id      text NOT NULL,
    valid_from   timestamptz NOT NULL,
    age          integer NOT NULL,
    country      text NOT NULL,
    fav_category text NOT NULL,
    activity     double precision NOT NULL,
    PRIMARY KEY (user_id, valid_from)
);

CREATE TABLE {schema}.ad_history (
    ad_id      text NOT NULL,
    valid_from timestamptz NOT NULL,
    advertiser text NOT NULL,
    category   text NOT NULL,
    price      double precision NOT NULL,
    quality    double precision NOT NULL,
    PRIMARY KEY (ad_id, valid_from)
);

-- Simulator runs and the hidden ground truth. No pipeline reads these two tables: only the audit does.
CREATE TABLE {schema}.sim_runs (
    run_id      bigserial PRIMARY KEY,
    seed        bigint NOT NULL,
    params      jsonb NOT NULL,
    sim_start   timestamptz NOT NULL,
    sim_end     timestamptz NOT NULL,
    drift_at    timestamptz,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    counts      jsonb
);

CREATE TABLE {schema}.oracle (
    impression_id text PRIMARY KEY,
    ts            timestamptz NOT NULL,
    regime        smallint NOT NULL,
    p_click       double precision NOT NULL,
    clicked       boolean NOT NULL
);
CREATE INDEX oracle_ts ON {schema}.oracle (ts);

-- What the simulator sent to the raw topic, one row per record (seq = the record's "seq" header), with the
-- verdict a correct cleaner must reach: clean, duplicate (dropped) or malformed (quarantined with reason).
CREATE TABLE {schema}.sim_ledger (
    seq        bigint PRIMARY KEY,
    event_id   text,
    event_type text NOT NULL,
    verdict    text NOT NULL CHECK (verdict IN ('clean', 'duplicate', 'malformed')),
    reason     text,
    sim_ts     timestamptz NOT NULL
);

-- Join pipeline output.
CREATE TABLE {schema}.training_examples (
    impression_id text PRIMARY KEY,
    ts            timestamptz NOT NULL,
    user_id       text NOT NULL,
    ad_id         text NOT NULL,
    slot          integer NOT NULL,
    device        text NOT NULL,
    age           integer,
    country       text,
    fav_category  text,
    activity      double precision,
    category      text,
    price         double precision,
    quality       double precision,
    enriched      boolean NOT NULL,
    label         smallint NOT NULL,
    click_ts      timestamptz,
    written_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX training_examples_ts ON {schema}.training_examples (ts);

-- Model registry. At most one deployed model per name.
CREATE TABLE {schema}.models (
    model_id    bigserial PRIMARY KEY,
    name        text NOT NULL,
    status      text NOT NULL CHECK (status IN ('candidate', 'deployed', 'retired', 'rejected')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    deployed_at timestamptz,
    retired_at  timestamptz,
    format      text NOT NULL,
    artefact    bytea NOT NULL,
    params      jsonb NOT NULL,
    metrics     jsonb NOT NULL,
    lineage     jsonb NOT NULL,
    decision    jsonb
);
CREATE UNIQUE INDEX models_one_deployed ON {schema}.models (name) WHERE status = 'deployed';

-- Online evaluation: additive statistics per micro-batch (idempotent per batch), and metrics per window.
CREATE TABLE {schema}.monitor_partials (
    window_start timestamptz NOT NULL,
    model_id     bigint NOT NULL,
    batch_id     bigint NOT NULL,
    n            bigint NOT NULL,
    clicks       bigint NOT NULL,
    sum_p        double precision NOT NULL,
    sum_log_loss double precision NOT NULL,
    hist         jsonb NOT NULL,
    features     jsonb NOT NULL,
    max_ts       timestamptz NOT NULL,
    PRIMARY KEY (window_start, model_id, batch_id)
);

CREATE TABLE {schema}.online_metrics (
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    model_id     bigint NOT NULL,
    n            bigint NOT NULL,
    clicks       bigint NOT NULL,
    ctr          double precision,
    mean_p       double precision,
    auc          double precision,
    log_loss     double precision,
    calibration  double precision,
    ece          double precision,
    psi          jsonb NOT NULL,
    max_psi      double precision,
    drift        boolean NOT NULL,
    degraded     boolean NOT NULL,
    reasons      text[] NOT NULL,
    complete     boolean NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (window_start, model_id)
);

-- Predictions with their outcome, as the online evaluation joined them.
CREATE TABLE {schema}.scored_outcomes (
    impression_id text PRIMARY KEY,
    ts            timestamptz NOT NULL,
    model_id      bigint NOT NULL,
    p             double precision NOT NULL,
    label         smallint NOT NULL
);
CREATE INDEX scored_outcomes_ts ON {schema}.scored_outcomes (ts);

-- Per micro-batch bookkeeping of the Spark pipelines (idempotent per batch).
CREATE TABLE {schema}.pipeline_batches (
    pipeline    text NOT NULL,
    batch_id    bigint NOT NULL,
    rows_in     bigint NOT NULL,
    rows_out    jsonb NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, batch_id)
);
