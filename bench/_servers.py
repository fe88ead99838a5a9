"""Servers the topology benchmark (and the failover test) start themselves: PgBouncer in front of a
server, and a primary with a synchronous streaming standby (a ``pg_basebackup`` of it, with the embedded
server's binaries)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgstreams.embedded import TemporaryServer, restartable_server

PGBOUNCER = Path("/usr/sbin/pgbouncer")
#: The ``application_name`` the standby streams with (named by ``synchronous_standby_names``).
STANDBY = "standby1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def pgbouncer(server_dsn: str, pool_mode: str, pool_size: int = 20, round_robin: bool = False
              ) -> Iterator[Callable[[str], str]]:
    """PgBouncer (``/usr/sbin/pgbouncer``) in ``pool_mode`` in front of the server of ``server_dsn``
    (every database, trust authentication, a free loopback port, at most ``pool_size`` server connections
    per database; with ``round_robin`` handing out its idle server connections in turn instead of the last
    one released first); yields the map from a database's DSN to the same database through the pooler. As
    root it runs as another user (PgBouncer refuses root): the owner of the server's socket directory when
    ``server_dsn`` names one, else ``postgres``."""
    if not PGBOUNCER.exists():
        raise RuntimeError(f"{PGBOUNCER} is missing: install PgBouncer (apt-get install pgbouncer)")
    server = conninfo_to_dict(server_dsn)
    host, port = str(server.get("host") or "127.0.0.1"), str(server.get("port") or 5432)
    user = str(server.get("user") or "postgres")
    runner = None
    if os.geteuid() == 0:
        owner = os.stat(host).st_uid if host.startswith("/") and os.path.isdir(host) else 0
        runner = pwd.getpwuid(owner).pw_name if owner != 0 else "postgres"
    root = Path(tempfile.mkdtemp(prefix="pgstreams-pgbouncer-"))
    listen = _free_port()
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={port}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
        f"listen_port = {listen}\nunix_socket_dir =\nauth_type = trust\nauth_file = {root / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\nmax_client_conn = 200\ndefault_pool_size = {pool_size}\n"
        f"server_round_robin = {int(round_robin)}\n"
        f"logfile = {root / 'pgbouncer.log'}\nignore_startup_parameters = extra_float_digits\n")
    if runner:
        for f in [root, *root.iterdir()]:
            shutil.chown(f, runner)
    prefix = ["runuser", "-u", runner, "--"] if runner else []
    proc = subprocess.Popen([*prefix, str(PGBOUNCER), str(root / "pgbouncer.ini")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def through(dsn: str) -> str:
        return make_conninfo(dsn, host="127.0.0.1", port=str(listen))

    def answers() -> bool:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            log = (root / "pgbouncer.log").read_text() if (root / "pgbouncer.log").exists() else ""
            raise RuntimeError(f"pgbouncer exited ({proc.returncode}): {out}\n{log}")
        try:
            psycopg.connect(through(server_dsn), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        _wait(answers, 30, "PgBouncer to accept connections")
        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class StandbyPair:
    """A primary and its synchronous standby, and the multi-host DSN of database ``app`` on both."""

    primary: TemporaryServer
    standby: TemporaryServer
    dsn: str

    def promote(self) -> None:
        """Promote the standby (``pg_ctl promote``, waiting until it takes writes)."""
        self.standby.promote()


def _port(dsn: str) -> int:
    return int(conninfo_to_dict(dsn).get("port") or 5432)


@contextmanager
def standby_pair(settings: dict[str, str] | None = None) -> Iterator[StandbyPair]:
    """A primary (``restartable_server``) with database ``app`` (pgstreams migrated), and a standby made by
    ``pg_basebackup`` of it, streaming, named by the primary's ``synchronous_standby_names`` once it is in
    sync. ``settings`` go to both servers."""
    from pgserver import _commands
    from pgserver.utils import find_suitable_port

    import pgstreams

    commands: Any = _commands
    settings = settings or {}
    with restartable_server({"wal_keep_size": "64MB", **settings}) as primary:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
        with pgstreams.connect(make_conninfo(primary.dsn, dbname="app")):
            pass  # migrated
        user = "pgserver" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="pgstreams-standby-"))
        try:
            if user is not None:
                entry = pwd.getpwnam(user)
                os.chown(root, entry.pw_uid, entry.pw_gid)
            data, log = root / "data", root / "server.log"
            p1 = _port(primary.dsn)
            source = f"host=127.0.0.1 port={p1} user=postgres application_name={STANDBY}"
            commands.pg_basebackup(["-D", str(data), "-R", "-X", "stream", "-c", "fast", "-d", source],
                                   user=user, timeout=120)
            port = find_suitable_port("127.0.0.1")
            options = " ".join([f"-h 127.0.0.1 -p {port} -k {root}",
                                *(f"-c {k}={v}" for k, v in settings.items())])
            standby = TemporaryServer(commands, data, log, options, user,
                                      f"postgresql://postgres@127.0.0.1:{port}/postgres")
            standby.start()
            try:
                with psycopg.connect(primary.dsn, autocommit=True) as conn:
                    def state() -> tuple[str, str] | None:
                        row = conn.execute("SELECT state, sync_state FROM pg_stat_replication "
                                           "WHERE application_name = %s", (STANDBY,)).fetchone()
                        return None if row is None else (str(row[0]), str(row[1]))

                    _wait(lambda: (state() or ("", ""))[0] == "streaming", 60, "the standby to stream")
                    conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
                    conn.execute("SELECT pg_reload_conf()")
                    _wait(lambda: state() == ("streaming", "sync"), 60, "the standby to be synchronous")
                dsn = (f"postgresql://postgres@127.0.0.1:{p1},127.0.0.1:{port}/app"
                       "?target_session_attrs=read-write")
                yield StandbyPair(primary, standby, dsn)
            finally:
                try:
                    standby.stop("immediate")
                except Exception:  # noqa: BLE001 - already stopped
                    pass
        finally:
            shutil.rmtree(root, ignore_errors=True)
