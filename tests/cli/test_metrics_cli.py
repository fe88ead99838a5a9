"""``pgstreams metrics serve`` and ``pgstreams worker --metrics-port``: the real HTTP endpoints of real
subprocesses, scraped as Prometheus would."""

from __future__ import annotations

import socket
import subprocess
import threading

import psycopg

import pgstreams
from _core_helpers import wait_until
from _obs_helpers import CLI, TESTS, get, server, value


def test_metrics_serve_exports_the_database_status_over_http(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("orders", 2)
        client.publish_many("orders", [{"value": i, "partition": i % 2} for i in range(10)])
        c = client.consumer("orders", "billing")
        assert c.poll(max_events=2, timeout=5)
        c.commit()
    with server(["metrics", "serve", "--port", "0", "--min-interval", "0", "--dsn", dsn],
                "serving metrics at") as srv:
        assert srv.url.startswith("http://127.0.0.1:")  # loopback by default
        text = get(srv.url + "/metrics")
        assert value(text, "pgstreams_up") == 1
        assert value(text, "pgstreams_partition_events", topic="orders", partition="0") == 5
        assert value(text, "pgstreams_topic_partitions", topic="orders") == 2
        lag = [value(text, "pgstreams_group_lag_events", group="billing", topic="orders", partition=str(p))
               for p in (0, 1)]
        assert sum(v or 0 for v in lag) == 8
        assert "dbname" not in text and "password" not in text
        srv.proc.terminate()
        assert srv.proc.wait(20) == 0, srv.output


def test_metrics_serve_exports_share_group_in_flight_and_delivery_counts(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("jobs", 2)
        client.publish_many("jobs", [{"value": i, "partition": i % 2} for i in range(8)])
    with server(["metrics", "serve", "--port", "0", "--min-interval", "0", "--dsn", dsn],
                "serving metrics at") as srv, pgstreams.connect(dsn) as client:
        text = get(srv.url + "/metrics")
        assert value(text, "pgstreams_up") == 1 and "pgstreams_share_group" not in text  # none yet
        consumer = client.share_consumer("jobs", "crunch", lock_timeout=600)
        got: list[pgstreams.Event] = []
        wait_until(lambda: got.extend(consumer.poll(max_events=8 - len(got), timeout=1)) or len(got) == 8,
                   60, "eight events acquired")
        consumer.ack(got[:2])
        consumer.release(got[2], delay=600)  # waits: delivered once, not due again for ten minutes
        consumer.reject(got[3], reason="bad")  # rejected, and a copy in the dead-letter topic
        text = get(srv.url + "/metrics")
        described = {s.partition: s for s in client.describe_share_group("crunch", "jobs")}
        assert sum(s.acquired for s in described.values()) == 4
        for p, s in described.items():
            labels = {"group": "crunch", "topic": "jobs", "partition": str(p)}
            assert value(text, "pgstreams_share_group_in_flight_events", **labels) == s.acquired
            assert value(text, "pgstreams_share_group_waiting_events", **labels) == s.waiting
            assert value(text, "pgstreams_share_group_available_events", **labels) == s.available == 0
            assert value(text, "pgstreams_share_group_frontier_position", **labels) == s.frontier
            assert value(text, "pgstreams_share_group_rejected_events_total", **labels) == s.rejected
            dead = value(text, "pgstreams_share_group_dead_lettered_events_total", **labels)
            assert dead == s.dead_lettered
            assert value(text, "pgstreams_share_group_deliveries_exhausted_events_total", **labels) == 0
            age = value(text, "pgstreams_share_group_oldest_lock_age_seconds", **labels)
            assert age is not None and (age > 0) == (s.acquired > 0)

        def total(name: str) -> float:
            return sum(value(text, name, group="crunch", topic="jobs", partition=str(p)) or 0 for p in (0, 1))

        assert total("pgstreams_share_group_in_flight_events") == 4
        assert total("pgstreams_share_group_waiting_events") == 1
        assert total("pgstreams_share_group_rejected_events_total") == 1
        assert total("pgstreams_share_group_dead_lettered_events_total") == 1
        consumer.ack(got[4:])
        text = get(srv.url + "/metrics")
        assert total("pgstreams_share_group_in_flight_events") == 0
        assert total("pgstreams_share_group_oldest_lock_age_seconds") == 0


def test_metrics_serve_reads_the_database_once_per_interval_however_many_scrapers(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 1)
    with server(["metrics", "serve", "--port", "0", "--min-interval", "3600", "--dsn", dsn],
                "serving metrics at") as srv:
        texts: list[str] = []
        threads = [threading.Thread(target=lambda: texts.append(get(srv.url + "/metrics"))) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        texts.append(get(srv.url + "/metrics"))
        assert len(texts) == 7
        assert {value(t, "pgstreams_status_reads_total") for t in texts} == {1.0}


def test_metrics_serve_bad_input_exits_non_zero_without_a_traceback(dsn: str) -> None:
    p = subprocess.run([*CLI, "metrics", "serve", "--port", "70000", "--dsn", dsn], capture_output=True,
                       text=True, timeout=60, cwd=TESTS)
    assert p.returncode == 2 and "--port" in p.stderr and "Traceback" not in p.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([*CLI, "metrics", "serve", "--port", str(port), "--dsn", dsn], capture_output=True,
                           text=True, timeout=60, cwd=TESTS)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "address" in p.stderr.lower(), p.stderr


def test_worker_metrics_port_exports_the_workers_own_metrics(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("jobs", 1)
        client.publish_many("jobs", [{"value": i} for i in range(1, 21)])  # 5, 10, 15, 20 fail
    args = ["worker", "obs_app:fail_fives", "--topic", "jobs", "--group", "g", "--max-attempts", "2",
            "--backoff", "0.01", "--member-id", "w1", "--metrics-port", "0", "--dsn", dsn]
    with server(args, "serving metrics at") as srv:
        def dead_lettered() -> str | None:
            text = get(srv.url + "/metrics")
            done = value(text, "pgstreams_worker_events_dead_lettered_total", member="w1") == 4
            return text if done else None

        text = wait_until(dead_lettered, 60, "four dead letters in the worker's metrics", every=0.2)
        assert value(text, "pgstreams_worker_events_handled_total", member="w1") == 16
        assert value(text, "pgstreams_worker_events_failed_total", member="w1") == 8
        assert value(text, "pgstreams_worker_events_retried_total", member="w1") == 4
        count = value(text, "pgstreams_worker_handler_duration_seconds_count", member="w1", topic="jobs",
                      group="g")
        assert count is not None and count >= 8
        assert value(text, "pgstreams_worker_batch_duration_seconds_count", member="w1", topic="jobs",
                     group="g")
        srv.proc.terminate()
        assert srv.proc.wait(30) == 0, srv.output


def test_serving_on_a_busy_port_names_the_address_and_exits_1(dsn: str) -> None:
    """``metrics serve`` and ``console`` on a port another socket listens on: one line naming the address
    and the reason, exit code 1, no traceback."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        for command in (["metrics", "serve"], ["console"]):
            p = subprocess.run([*CLI, *command, "--host", "127.0.0.1", "--port", str(port), "--dsn", dsn],
                               capture_output=True, text=True, timeout=120, cwd=TESTS)
            assert p.returncode == 1, (command, p.stderr)
            assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in p.stderr, p.stderr
            assert "Traceback" not in p.stderr


def test_metrics_serve_exports_each_captures_slot_lag_wal_status_and_safe_wal_size(cdc_dsn: str) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE other (id int)")
    with pgstreams.connect(cdc_dsn) as client:
        client.cdc.add(["orders"], topic_prefix="shop")
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (1), (2)")
            conn.execute("INSERT INTO other SELECT generate_series(1, 20000)")  # WAL the slot keeps
        with server(["metrics", "serve", "--port", "0", "--min-interval", "0", "--dsn", cdc_dsn],
                    "serving metrics at") as srv:
            text = get(srv.url + "/metrics")
            info = client.cdc.describe("shop")
            assert value(text, "pgstreams_cdc_up") == 1
            assert value(text, "pgstreams_cdc_slot_present", capture="shop") == 1
            assert value(text, "pgstreams_cdc_slot_active", capture="shop") == 0  # nobody captures
            lag = value(text, "pgstreams_cdc_slot_lag_bytes", capture="shop")
            assert lag is not None and info.lag_bytes is not None and 100_000 < lag <= info.lag_bytes
            assert value(text, "pgstreams_cdc_slot_wal_status", capture="shop", status=info.wal_status) == 1
            assert sum(value(text, "pgstreams_cdc_slot_wal_status", capture="shop", status=s) or 0
                       for s in ("reserved", "extended", "unreserved", "lost")) == 1
            # no max_slot_wal_keep_size on the test server: no safe_wal_size, and the metric is absent
            assert info.safe_wal_size is None
            assert value(text, "pgstreams_cdc_slot_safe_wal_size_bytes", capture="shop") is None
            assert value(text, "pgstreams_cdc_changes_total", capture="shop") == 0
            client.cdc.capture("shop")
            text = get(srv.url + "/metrics")
            assert value(text, "pgstreams_cdc_changes_total", capture="shop") == 2
            lag = value(text, "pgstreams_cdc_slot_lag_bytes", capture="shop")
            assert lag is not None and lag < 100_000  # captured: the slot advanced
            with psycopg.connect(cdc_dsn, autocommit=True) as conn:  # a limit: safe_wal_size appears
                conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'")
                conn.execute("SELECT pg_reload_conf()")
            try:
                wait_until(lambda: client.cdc.describe("shop").safe_wal_size is not None, 20,
                           "the server reloading its configuration")
                text = get(srv.url + "/metrics")
                safe = value(text, "pgstreams_cdc_slot_safe_wal_size_bytes", capture="shop")
                now = client.cdc.describe("shop").safe_wal_size
                assert safe is not None and now is not None and 0 < safe and abs(safe - now) < 64 << 20
            finally:
                with psycopg.connect(cdc_dsn, autocommit=True) as conn:
                    conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
                    conn.execute("SELECT pg_reload_conf()")
            srv.proc.terminate()
            assert srv.proc.wait(20) == 0, srv.output
