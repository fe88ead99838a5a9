"""The serving path in processes of its own (``pgstreams_ml.serving``): the CPU priority of everything else,
the clean query's own process (``python -m pgstreams_ml clean --status``) and serving processes that end
with the process that started them. Real processes, a real PostgreSQL database and a real Spark driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

import pgstreams
from pgstreams.errors import InvalidArgument
from pgstreams_ml import audit
from pgstreams_ml._util import wait_until
from pgstreams_ml.config import Topology, setup
from pgstreams_ml.demo import DemoOptions
from pgstreams_ml.serving import CleanStatus, lower_priority, resolve_mode, thread_nice_values
from pgstreams_ml.simulator import SimConfig, Simulator

#: A process that starts two threads, prints its thread ids, and on each line of input starts one more
#: thread and one child process, printing the new thread's id and the child's pid.
_THREADS = r"""
import os, subprocess, sys, threading
stop = threading.Event()
ids = []
def hold():
    ids.append(threading.get_native_id())
    stop.wait()
for _ in range(2):
    threading.Thread(target=hold, daemon=True).start()
while len(ids) < 2:
    pass
print(" ".join(map(str, ids)), flush=True)
for line in sys.stdin:
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    while len(ids) < 3:
        pass
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    print(ids[-1], child.pid, flush=True)
    sys.stdin.readline()
    child.stdin.close()
    child.wait()
    break
"""


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values are Linux's")
def test_lower_priority_lowers_every_thread_and_what_they_start_later() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = [int(t) for t in proc.stdout.readline().split()]
        base = _nice(proc.pid)
        assert all(_nice(t) == base for t in first)
        changed = lower_priority(proc.pid, 5)
        assert changed >= 3  # the main thread and the two others
        values = thread_nice_values(proc.pid)
        assert set(first) | {proc.pid} <= set(values)
        assert set(values.values()) == {min(19, base + 5)}
        # a thread and a process started afterwards inherit the lower priority
        proc.stdin.write("more\n")
        proc.stdin.flush()
        tid, child = (int(x) for x in proc.stdout.readline().split())
        assert _nice(tid) == min(19, base + 5)
        assert _nice(child) == min(19, base + 5)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
        assert lower_priority(os.getpid(), 0) == 0  # 0 changes nothing
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_serving_modes_and_demo_options() -> None:
    assert resolve_mode("auto", None) == "processes"
    assert resolve_mode("auto", "local[3]") == "processes"
    assert resolve_mode("auto", "spark://127.0.0.1:7077") == "session"
    assert resolve_mode("session", None) == "session"
    assert resolve_mode("processes", "spark://h:7077") == "processes"
    with pytest.raises(ValueError, match="serving mode"):
        resolve_mode("threads", None)
    assert DemoOptions().serving_mode == "processes"
    assert DemoOptions(master="spark://h:7077").serving_mode == "session"
    with pytest.raises(InvalidArgument, match="serving mode"):
        DemoOptions(serving="threads")
    with pytest.raises(InvalidArgument, match="background_nice"):
        DemoOptions(background_nice=20)


def _simulate(client: pgstreams.Client, topo: Topology, hour: int) -> None:
    cfg = SimConfig(
        seed=hour,
        users=100,
        ads=20,
        duration=600.0,
        malformed_rate=0.05,
        duplicate_rate=0.05,
        start=SimConfig().start + timedelta(hours=hour),
    )
    Simulator(client, cfg, topo).run()


def _ml(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgstreams_ml", *args]


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_clean_process_cleans_as_events_arrive_reports_its_status_and_stops_on_sigterm(
    dsn: str, tmp_path: Path
) -> None:
    topo = Topology(partitions=2)
    status_path = tmp_path / "status.json"
    started = time.time()
    with pgstreams.connect(dsn) as client:
        setup(client, topo)
        _simulate(client, topo, 1)
        raw = client.describe_topic(topo.raw_topic).events
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        proc = subprocess.Popen(
            _ml("clean", "--dsn", dsn, "--checkpoint", str(tmp_path / "ck"), "--trigger", "0 seconds",
                "--partitions", "2", "--status", str(status_path), "--warm-up"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:

            def read_through(n: int) -> bool:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                st = CleanStatus.read(status_path)
                return st is not None and st.rows >= n

            assert wait_until(lambda: read_through(raw), 300), CleanStatus.read(status_path)
            st = CleanStatus.read(status_path)
            assert st is not None and st.state == "running" and st.pid == proc.pid
            assert st.rows == raw and st.batches >= 1 and st.busy_seconds > 0
            assert st.phases_ms.get("addBatch", 0) > 0
            # each micro-batch that read rows is logged: its start (during this test) and its phases
            assert len(st.batch_log) == st.batches
            assert all(started - 60 < b[0] <= time.time() and b[1] > 0 and b[3] > 0 for b in st.batch_log)
            # it keeps running: events published later are cleaned too, without a restart
            _simulate(client, topo, 2)
            more = client.describe_topic(topo.raw_topic).events
            assert more > raw
            assert wait_until(lambda: read_through(more), 300), CleanStatus.read(status_path)
            assert wait_until(lambda: sum(s.lag for s in client.describe_group(topo.clean_group)) == 0, 60)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        final = CleanStatus.read(status_path)
        assert final is not None and final.state == "stopped" and final.rows == more
        assert json.loads(out.strip().splitlines()[-1])["rows"] == more
        rec = audit.reconcile(client, topo)
        assert rec.ok, rec.problems
        assert rec.raw == more and rec.quarantined > 0 and rec.dropped_duplicates > 0


_PARENT = r"""
import subprocess, sys
child = subprocess.Popen(sys.argv[1:])
print(child.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def test_a_serving_process_ends_when_the_process_that_started_it_dies(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        setup(client, Topology(partitions=2))
    scorer_args = _ml("score", "--dsn", dsn, "--partitions", "2", "--exit-with-parent")
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, *scorer_args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    scorer = int(parent.stdout.readline())
    try:
        # the scorer joins its group, then its parent is killed without a chance to stop it
        assert wait_until(lambda: _members(dsn) > 0, 120)
        assert _alive(scorer)
        parent.kill()
        parent.wait(30)
        assert wait_until(lambda: not _alive(scorer), 60), "the orphaned scorer kept running"
        assert wait_until(lambda: _members(dsn) == 0, 60)  # it left its group cleanly
    finally:
        if _alive(scorer):
            os.kill(scorer, signal.SIGKILL)


def _members(dsn: str) -> int:
    with pgstreams.connect(dsn, migrate=False) as client:
        try:
            return sum(1 for s in client.describe_group(Topology().scorer_group) if s.owner)
        except pgstreams.GroupNotFound:
            return 0


def test_status_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    assert CleanStatus.read(path) is None
    st = CleanStatus(pid=1, state="running", batches=2, rows=10, phases_ms={"addBatch": 3.0})
    st.write(path)
    again = CleanStatus.read(path)
    assert again is not None and again.rows == 10 and again.phases_ms == {"addBatch": 3.0}
    assert again.updated > time.time() - 60
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary file left
