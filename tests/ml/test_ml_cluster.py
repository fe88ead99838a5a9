"""The ML pipelines on a Spark standalone cluster: a master and two workers on loopback, started with
pyspark's own ``spark-class`` and stopped afterwards; ``pgstreams demo --master spark://...`` runs every
pipeline on the cluster's executors and must reconcile and meet the quality bars, as on ``local[2]``.

The workers run in folders of their own with an environment of their own (no ``PGSTREAMS_DSN``, another
``HOME`` and ``TMPDIR``): what the executors need reaches them through the pipelines' arguments (the DSN,
topic names), not through the driver's process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from _core_helpers import until
from pgstreams.spark_daemon import use_compiled_pyspark

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _absolute_path_list(value: str) -> str:
    """``value`` (a PYTHONPATH) with every entry made absolute (the daemons and the demo run elsewhere)."""
    return os.pathsep.join(str(Path(p).resolve()) for p in value.split(os.pathsep) if p)


def _worker_env(home: Path) -> dict[str, str]:
    """The workers' environment: what Java and Python need, nothing of the driver's configuration."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(home / "logs"),
        "SPARK_DAEMON_MEMORY": "256m",
    }
    for name in ("JAVA_HOME", "LANG", "JAVA_TOOL_OPTIONS"):
        if name in os.environ:
            env[name] = os.environ[name]
    # the executors' Python workers import the installed, compiled PySpark (docs/spark.md), as the driver's
    use_compiled_pyspark("spark://", env)
    if os.environ.get("PYTHONPATH"):  # a checkout's code, when it is set
        env["PYTHONPATH"] = _absolute_path_list(os.environ["PYTHONPATH"])
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return env


@contextmanager
def standalone_cluster(root: Path, workers: int = 2) -> Iterator[tuple[str, list[Path]]]:
    """A Spark standalone master and ``workers`` workers (1 core, 1 GiB each) on 127.0.0.1; yields the
    master URL and the workers' work folders. Every daemon is stopped (its process group) at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(name: str, args: list[str]) -> Path:
        home = root / name
        home.mkdir(parents=True, exist_ok=True)
        log = home / "daemon.log"
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [str(_spark_class()), *args],
                    cwd=home,
                    env=_worker_env(home),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        logs.append(log)
        return home

    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    try:
        master = start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(_free_port())],
        )
        until(lambda: "I have been elected leader" in (master / "daemon.log").read_text(errors="replace"),
              timeout=180, what="the Spark master to start")
        dirs = []
        for i in range(workers):
            home = start(
                f"worker{i}",
                ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                 "--memory", "1g", "--webui-port", str(_free_port()),
                 "--work-dir", str(root / f"worker{i}" / "work"), url],
            )
            dirs.append(home / "work")

        def registered() -> bool:
            return (master / "daemon.log").read_text(errors="replace").count("Registering worker") >= workers

        until(registered, timeout=180, what="the Spark workers to register")
        yield url, dirs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        for p in procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)


@pytest.mark.timeout(1500)
def test_demo_on_a_standalone_cluster_reconciles_and_meets_the_quality_bars(dsn: str, tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    with standalone_cluster(tmp_path / "cluster") as (url, work_dirs):
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, COLUMNS="200")
        env.pop("PGSTREAMS_DSN", None)
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = _absolute_path_list(env["PYTHONPATH"])
        proc = subprocess.run(
            [sys.executable, "-m", "pgstreams.cli", "demo", "--master", url, "--dsn", dsn,
             "--reports", str(reports), "--duration", "2h", "--rate", "3", "--users", "800", "--ads", "80",
             "--speed", "0", "--partitions", "2", "--no-progress", "--strict", "--timeout", "1300",
             "--trigger", "4 seconds"],  # fewer micro-batches, less CPU beside the suite (test_ml_demo.py)
            capture_output=True,
            text=True,
            timeout=1400,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # both workers ran executors of the demo's application
        for work in work_dirs:
            apps = list(work.glob("app-*/*/stderr")) if work.exists() else []
            assert apps, f"no executor ran in {work}"
    summary = json.loads((reports / "summary.json").read_text())
    rec = summary["reconciliation"]
    assert rec["ok"], rec["problems"]
    assert rec["raw"] == rec["clean"] + rec["quarantined"] + rec["dropped_duplicates"]
    assert rec["quarantined"] == rec["expected_malformed"] > 0
    assert rec["dropped_duplicates"] == rec["expected_duplicates"] > 0
    models = summary["models"]
    assert len(models) == 2 and all(m["promoted"] for m in models)
    assert all(q["ok"] for q in summary["quality"].values()), summary["quality"]
    assert summary["latency"]["raw -> prediction"]["count"] > 500
    assert summary["options"]["master"] == url
    assert summary["serving"]["mode"] == "session"  # one application on the cluster: the clean query too
