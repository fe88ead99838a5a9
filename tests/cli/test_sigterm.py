"""SIGTERM stops the commands that run until stopped at whatever moment of their start-up it comes: the
signal raises an exception wherever the command is, and a clean-up on its way (psycopg leaving a busy
pipeline, for one) could replace it with an error that was then handled, leaving the command serving
forever. Each command is started many times at once and sent SIGTERM at offsets spread over its start-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pgstreams
from _core_helpers import until

COMMANDS = {
    "metrics serve": ["metrics", "serve", "--port", "0"],
    "consume --follow": ["consume", "orders", "-g", "live", "--from", "latest", "--follow"],
    "kafka serve": ["kafka", "serve", "--listen", "127.0.0.1:0"],
}
#: Processes per command; their SIGTERMs are spread over the second half of a start-up.
COPIES = 12


def _start(argv: list[str], dsn: str, cwd: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PGSTREAMS_DSN=dsn)
    return subprocess.Popen([sys.executable, "-m", "pgstreams.cli", *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _startup_seconds(argv: list[str], dsn: str, cwd: Path) -> float:
    """How long the command takes to be up (its "serving ..." line, or a second of polling)."""
    began = time.monotonic()
    proc = _start(argv, dsn, cwd)
    try:
        if argv[0] == "consume":  # no line to wait for: up once it created its group
            with pgstreams.connect(dsn) as client:
                until(lambda: any(g.group == "live" for g in client.list_groups()), timeout=60,
                      what="consume to create its group")
        else:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            assert "serving" in line, line
        return time.monotonic() - began
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


def _signal_due(pending: list[tuple[subprocess.Popen[str], float]]) -> None:
    """SIGTERM to each pending process whose time came (removed from ``pending``)."""
    now = time.monotonic()
    for proc, at in list(pending):
        if now >= at:
            os.killpg(proc.pid, signal.SIGTERM)
            pending.remove((proc, at))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigterm_at_any_moment_of_start_up_stops_the_command(name: str, dsn: str, tmp_path: Path) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("orders", partitions=3)
    argv = COMMANDS[name]
    up = _startup_seconds(argv, dsn, tmp_path)
    # the copies start one after the other, half a start-up apart (a few at once), and each gets its
    # SIGTERM at a point of the second half of a start-up, when it reads and connects
    offsets = [up * (0.5 + 0.6 * i / (COPIES - 1)) for i in range(COPIES)]
    began = time.monotonic()
    procs: list[tuple[subprocess.Popen[str], float]] = []
    pending: list[tuple[subprocess.Popen[str], float]] = []
    for i, off in enumerate(offsets):
        while time.monotonic() < began + i * up / 2:
            _signal_due(pending)
            time.sleep(0.01)
        proc = _start(argv, dsn, tmp_path)
        procs.append((proc, off))
        pending.append((proc, time.monotonic() + off))
    while pending:
        _signal_due(pending)
        time.sleep(0.01)
    stuck = []
    for proc, off in procs:
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _out, err = proc.communicate(timeout=30)
            stuck.append(f"SIGTERM {off:.2f} s after start: still running 30 s later; stderr: {err[-1500:]}")
            continue
        # 0 or 143 (its own exit), or ended by the signal itself before Python took it over
        assert proc.returncode in (0, 143, -signal.SIGTERM), (off, proc.returncode, err[-2000:])
        assert "Traceback" not in err, (off, err[-2000:])
    assert not stuck, stuck
