-- Named queries of the ML application. {schema} is the application's schema (a quoted identifier); values
-- are always bound parameters.

-- name: copy_oracle
COPY {schema}.oracle (impression_id, ts, regime, p_click, clicked) FROM STDIN;

-- name: copy_ledger
COPY {schema}.sim_ledger (seq, event_id, event_type, verdict, reason, sim_ts) FROM STDIN;

-- name: insert_sim_run
INSERT INTO {schema}.sim_runs (seed, params, sim_start, sim_end, drift_at) VALUES (%s, %s, %s, %s, %s)
RETURNING run_id;

-- name: finish_sim_run
UPDATE {schema}.sim_runs SET finished_at = now(), counts = %s WHERE run_id = %s;

-- name: insert_user_history
INSERT INTO {schema}.user_history (user_id, age, country, fav_category, activity, valid_from)
SELECT * FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[], %s::float8[], %s::timestamptz[])
ON CONFLICT DO NOTHING;

-- name: upsert_users
INSERT INTO {schema}.users AS u (user_id, age, country, fav_category, activity, valid_from)
SELECT * FROM unnest(%s::text[], %s::int[], %s::text[], %s::text[], %s::float8[], %s::timestamptz[])
ON CONFLICT (user_id) DO UPDATE
   SET age = excluded.age, country = excluded.country, fav_category = excluded.fav_category,
       activity = excluded.activity, valid_from = excluded.valid_from, updated_at = now(),
       version = u.version + 1
 WHERE excluded.valid_from > u.valid_from;

-- name: insert_ad_history
INSERT INTO {schema}.ad_history (ad_id, advertiser, category, price, quality, valid_from)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[], %s::timestamptz[])
ON CONFLICT DO NOTHING;

-- name: upsert_ads
INSERT INTO {schema}.ads AS a (ad_id, advertiser, category, price, quality, valid_from)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[], %s::timestamptz[])
ON CONFLICT (ad_id) DO UPDATE
   SET advertiser = excluded.advertiser, category = excluded.category, price = excluded.price,
       quality = excluded.quality, valid_from = excluded.valid_from, updated_at = now(),
       version = a.version + 1
 WHERE excluded.valid_from > a.valid_from;

-- name: get_users
SELECT user_id, age, country, fav_category, activity, valid_from FROM {schema}.users WHERE user_id = ANY(%s);

-- name: get_ads
SELECT ad_id, advertiser, category, price, quality, valid_from FROM {schema}.ads WHERE ad_id = ANY(%s);

-- name: user_history_of
SELECT user_id, valid_from, age, country, fav_category, activity
  FROM {schema}.user_history WHERE user_id = ANY(%s);

-- name: ad_history_of
SELECT ad_id, valid_from, advertiser, category, price, quality FROM {schema}.ad_history WHERE ad_id = ANY(%s);

-- name: record_batch
INSERT INTO {schema}.pipeline_batches (pipeline, batch_id, rows_in, rows_out) VALUES (%s, %s, %s, %s)
ON CONFLICT (pipeline, batch_id) DO UPDATE SET rows_in = excluded.rows_in, rows_out = excluded.rows_out,
       finished_at = now();

-- name: stage_examples
CREATE TEMP TABLE stage_examples (
    impression_id text, ts timestamptz, user_id text, ad_id text, slot integer, device text, label smallint,
    click_ts timestamptz
) ON COMMIT DROP;

-- name: copy_examples
COPY stage_examples (impression_id, ts, user_id, ad_id, slot, device, label, click_ts) FROM STDIN;

-- name: merge_examples
INSERT INTO {schema}.training_examples AS t (impression_id, ts, user_id, ad_id, slot, device, age, country,
       fav_category, activity, category, price, quality, enriched, label, click_ts)
SELECT s.impression_id, s.ts, s.user_id, s.ad_id, s.slot, s.device, u.age, u.country, u.fav_category,
       u.activity, a.category, a.price, a.quality, u.user_id IS NOT NULL AND a.ad_id IS NOT NULL, s.label,
       s.click_ts
  FROM (SELECT DISTINCT ON (impression_id) * FROM stage_examples ORDER BY impression_id, label DESC, click_ts) s
  LEFT JOIN LATERAL (SELECT * FROM {schema}.user_history h
                      WHERE h.user_id = s.user_id AND h.valid_from <= s.ts
                      ORDER BY h.valid_from DESC LIMIT 1) u ON true
  LEFT JOIN LATERAL (SELECT * FROM {schema}.ad_history h
                      WHERE h.ad_id = s.ad_id AND h.valid_from <= s.ts
                      ORDER BY h.valid_from DESC LIMIT 1) a ON true
ON CONFLICT (impression_id) DO UPDATE
   SET label = GREATEST(t.label, excluded.label), click_ts = COALESCE(t.click_ts, excluded.click_ts);

-- name: register_model
INSERT INTO {schema}.models (name, status, format, artefact, params, metrics, lineage)
VALUES (%s, 'candidate', %s, %s, %s, %s, %s) RETURNING model_id;

-- name: get_model
SELECT model_id, name, status, created_at, deployed_at, params, metrics, lineage, decision
  FROM {schema}.models WHERE model_id = %s;

-- name: deployed_model
SELECT model_id, name, status, created_at, deployed_at, params, metrics, lineage, decision
  FROM {schema}.models WHERE name = %s AND status = 'deployed';

-- name: deployed_model_id
SELECT model_id FROM {schema}.models WHERE name = %s AND status = 'deployed';

-- name: model_artefact
SELECT artefact FROM {schema}.models WHERE model_id = %s;

-- name: list_models
SELECT model_id, name, status, created_at, deployed_at, params, metrics, lineage, decision
  FROM {schema}.models ORDER BY model_id;

-- name: lock_deployed
SELECT model_id FROM {schema}.models WHERE name = %s AND status = 'deployed' FOR UPDATE;

-- name: retire_model
UPDATE {schema}.models SET status = 'retired', retired_at = now() WHERE model_id = %s;

-- name: deploy_model
UPDATE {schema}.models SET status = 'deployed', deployed_at = now(), decision = %s
 WHERE model_id = %s AND status = 'candidate';

-- name: reject_model
UPDATE {schema}.models SET status = 'rejected', decision = %s WHERE model_id = %s AND status = 'candidate';

-- name: load_examples
SELECT impression_id, ts, slot, device, age, country, fav_category, activity, category, price, quality, label
  FROM {schema}.training_examples
 WHERE enriched AND ts >= %s AND ts < %s
 ORDER BY impression_id;

-- name: promote_lock
SELECT pg_advisory_xact_lock(hashtext('pgstreams_ml.promote'), hashtext(%s));

-- name: stage_outcomes
CREATE TEMP TABLE stage_outcomes (LIKE {schema}.scored_outcomes) ON COMMIT DROP;

-- name: copy_outcomes
COPY stage_outcomes (impression_id, ts, model_id, p, label) FROM STDIN;

-- name: merge_outcomes
INSERT INTO {schema}.scored_outcomes AS s (impression_id, ts, model_id, p, label)
SELECT DISTINCT ON (impression_id) impression_id, ts, model_id, p, label
  FROM stage_outcomes ORDER BY impression_id, label DESC
ON CONFLICT (impression_id) DO UPDATE SET label = GREATEST(s.label, excluded.label);

-- name: insert_partial
INSERT INTO {schema}.monitor_partials (window_start, model_id, batch_id, n, clicks, sum_p, sum_log_loss, hist,
                                       features, max_ts)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING;

-- name: max_partial_ts
SELECT max(max_ts) FROM {schema}.monitor_partials;

-- name: open_windows
SELECT window_start, model_id FROM {schema}.online_metrics WHERE NOT complete ORDER BY 1, 2;

-- name: partials_of
SELECT n, clicks, sum_p, sum_log_loss, hist, features, max_ts FROM {schema}.monitor_partials
 WHERE window_start = %s AND model_id = %s;

-- name: upsert_metrics
INSERT INTO {schema}.online_metrics (window_start, window_end, model_id, n, clicks, ctr, mean_p, auc, log_loss,
       calibration, ece, psi, max_psi, drift, degraded, reasons, complete)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (window_start, model_id) DO UPDATE
   SET window_end = excluded.window_end, n = excluded.n, clicks = excluded.clicks, ctr = excluded.ctr,
       mean_p = excluded.mean_p, auc = excluded.auc, log_loss = excluded.log_loss,
       calibration = excluded.calibration, ece = excluded.ece, psi = excluded.psi, max_psi = excluded.max_psi,
       drift = excluded.drift, degraded = excluded.degraded, reasons = excluded.reasons,
       complete = excluded.complete, updated_at = now();

-- name: online_metrics
SELECT window_start, window_end, model_id, n, clicks, ctr, mean_p, auc, log_loss, calibration, ece, psi, max_psi,
       drift, degraded, reasons, complete
  FROM {schema}.online_metrics ORDER BY window_start, model_id;

-- name: ledger
SELECT seq, event_id, verdict, reason FROM {schema}.sim_ledger ORDER BY seq;

-- name: oracle_on_examples
SELECT o.p_click, e.label FROM {schema}.training_examples e JOIN {schema}.oracle o USING (impression_id)
 WHERE e.enriched AND e.ts >= %s AND e.ts < %s;

-- name: outcomes_with_oracle
SELECT s.p, s.label, o.p_click FROM {schema}.scored_outcomes s JOIN {schema}.oracle o USING (impression_id)
 WHERE (%s::bigint IS NULL OR s.model_id = %s)
   AND (%s::timestamptz IS NULL OR s.ts >= %s) AND (%s::timestamptz IS NULL OR s.ts < %s);

-- name: latest_sim_run
SELECT run_id, params, sim_start, sim_end, drift_at, counts FROM {schema}.sim_runs ORDER BY run_id DESC LIMIT 1;

-- name: max_negative_ts
SELECT max(ts) FROM {schema}.training_examples WHERE label = 0;

-- name: count_examples
SELECT count(*) FROM {schema}.training_examples;

-- name: first_degraded
SELECT min(window_start) FROM {schema}.online_metrics WHERE complete AND degraded AND window_start > %s;

-- name: count_complete_windows
SELECT count(DISTINCT window_start) FROM {schema}.online_metrics WHERE complete;

-- name: count_degraded
SELECT count(*) FROM {schema}.online_metrics WHERE complete AND degraded;

-- name: last_ledger_seq
SELECT max(seq) FROM {schema}.sim_ledger;
