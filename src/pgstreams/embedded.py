"""The embedded PostgreSQL server used when no DSN is configured.

The server comes from the ``pgserver`` wheel (PostgreSQL binaries bundled in a Python package). Its data
lives under ``$PGSTREAMS_HOME/pgdata`` (default: the user's data directory, e.g.
``~/.local/share/pgstreams/pgdata``), persists between runs, and the next :func:`embedded_dsn` reuses it.
A data folder it initialises gets :data:`EMBEDDED_SETTINGS` (``wal_level = logical``, for change data
capture); one made by an older version keeps its configuration (``pgstreams cdc add`` says what to set).
The server is shared by every process of the user that uses it and stops when the last one exits (a
process killed without exiting, SIGKILL, is forgotten by the next one that starts). :func:`server_status`,
:func:`start_server` and :func:`stop_server` (``pgstreams server status|start|stop``) show it, keep it
running for other programs, and stop it.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .errors import ConfigurationError

_lock = threading.Lock()
_servers: dict[Path, Any] = {}


def home() -> Path:
    """The pgstreams data directory: ``$PGSTREAMS_HOME``, else the user's data directory."""
    env = os.environ.get("PGSTREAMS_HOME")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return (base / "pgstreams").resolve()


def embedded_dsn(pgdata: Path | None = None, database: str = "postgres") -> str:
    """Start (or reuse) the embedded server and return a DSN for ``database`` on it.

    ``pgdata`` defaults to ``home() / "pgdata"``. Raises :class:`ConfigurationError` when the
    ``pgserver`` package is missing or the server cannot start.
    """
    path = (pgdata or home() / "pgdata").resolve()
    with _lock:
        srv = _servers.get(path)
        if srv is None:
            try:
                with warnings.catch_warnings():
                    # On import pgserver asks platformdirs for the user's runtime directory (for its lock
                    # file, and for the server's socket when the data path is too long for one), and
                    # platformdirs warns when $XDG_RUNTIME_DIR is unset (no login session: containers, CI,
                    # cron) before using its own fallback, which serves as well.
                    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR", category=UserWarning)
                    # imported when first needed: a client given a DSN never pays its import (0.1 to 0.5 s)
                    import pgserver
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ConfigurationError(
                    "no DSN given (--dsn / PGSTREAMS_DSN) and the embedded server is not installed: "
                    "pip install pgserver"
                ) from exc
            except OSError as exc:  # pragma: no cover - no usable runtime directory (platformdirs)
                raise ConfigurationError(f"cannot set up the embedded PostgreSQL: {exc}") from exc
            path.mkdir(parents=True, exist_ok=True)
            # Processes starting the server at once (parallel test workers, a shell and a worker) would
            # race in its first-time set-up (as root: creating the system user that runs it, initdb):
            # one at a time, the others then find it set up or running.
            with open(path.parent / f".{path.name}.start-lock", "a+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                _forget_dead_users(path)
                fresh = not (path / "PG_VERSION").exists()
                try:
                    srv = pgserver.get_server(path, cleanup_mode="stop")
                    if fresh:  # initialised and started just now, by this process alone: once more, set up
                        _configure(path)
                        from pgserver import _commands

                        commands: Any = _commands
                        commands.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=path,
                                        user="pgserver" if os.geteuid() == 0 else None, timeout=60)
                        # pgserver stops the server when its last user exits only if the postmaster it
                        # recorded still runs: record the restarted one
                        srv.ensure_postgres_running()
                except Exception as exc:
                    raise ConfigurationError(
                        f"cannot start the embedded PostgreSQL in {path}: {exc}") from exc
            _servers[path] = srv
    uri: str = srv.get_uri(database)
    return uri


#: The settings the embedded server starts with: logical decoding for change data capture
#: (:mod:`pgstreams.cdc`).
EMBEDDED_SETTINGS = {"wal_level": "logical"}


def _configure(pgdata: Path) -> None:
    """Write :data:`EMBEDDED_SETTINGS` into the configuration of a data folder just initialised
    (``postgresql.conf`` of ``pgdata``) where it lacks them; they apply from the server's next start."""
    conf = pgdata / "postgresql.conf"
    try:
        text = conf.read_text()
    except OSError:  # pragma: no cover - not initialised: nothing to configure
        return
    lines = text.splitlines()
    missing = {k: v for k, v in EMBEDDED_SETTINGS.items()
               if not any(line.strip().startswith(f"{k} = {v}") for line in lines)}
    if missing:
        added = "".join(f"{k} = {v}  # pgstreams: change data capture\n" for k, v in missing.items())
        conf.write_text(text + ("" if text.endswith("\n") else "\n") + added)


class TemporaryServer:
    """A throw-away PostgreSQL of :func:`restartable_server`: :attr:`dsn` of its ``postgres`` database,
    and :meth:`stop`, :meth:`start` and :meth:`restart` (same port and data), and :meth:`promote` for one
    started as a standby."""

    def __init__(self, commands: Any, data: Path, log: Path, options: str, user: str | None, dsn: str
                 ) -> None:
        self._commands = commands
        self._data = data
        self._log = log
        self._options = options
        self._user = user
        self.dsn = dsn

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._commands.pg_ctl(["-w", "-o", self._options, "-l", str(self._log), "start"], pgdata=self._data,
                              user=self._user, timeout=60)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``mode`` ``"fast"`` (default: sessions are ended, the server shuts down
        cleanly) or ``"immediate"`` (no shutdown checkpoint: crash recovery at the next start)."""
        if mode not in ("fast", "immediate", "smart"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        self._commands.pg_ctl(["-w", "-m", mode, "stop"], pgdata=self._data, user=self._user, timeout=60)

    def promote(self) -> None:
        """Promote a server started as a standby (``pg_ctl promote``) and wait until it takes writes."""
        self._commands.pg_ctl(["-w", "promote"], pgdata=self._data, user=self._user, timeout=60)

    def restart(self, mode: str = "fast", down: float = 0.0) -> None:
        """:meth:`stop` with ``mode``, stay down ``down`` seconds (default 0), :meth:`start`."""
        self.stop(mode)
        if down > 0:
            time.sleep(down)
        self.start()


@contextmanager
def restartable_server(settings: Mapping[str, str] | None = None, *, password: str | None = None
                       ) -> Iterator[TemporaryServer]:
    """As :func:`temporary_server`, but yields the :class:`TemporaryServer`, which can be stopped and
    restarted (for fault tests and benchmarks). With ``password``, connections over TCP authenticate
    with SCRAM-SHA-256 (the superuser ``postgres`` with that password, in :attr:`TemporaryServer.dsn`)
    instead of being trusted."""
    embedded_dsn()  # first-time set-up of the binaries (and, as root, of the system user that runs them)

    # pgserver is imported when first needed, as in embedded_dsn
    from pgserver import _commands
    from pgserver.utils import find_suitable_port

    commands: Any = _commands  # initdb / pg_ctl are generated at import
    user = "pgserver" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="pgstreams-pg-"))
    data, log = root / "data", root / "server.log"
    options = " ".join(f"-c {k}={v}" for k, v in (settings or {}).items())
    try:
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        auth = ["--auth=trust"]
        if password is not None:
            secret = root / "pwfile"
            secret.write_text(password + "\n")
            if user is not None:
                os.chown(secret, entry.pw_uid, entry.pw_gid)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={secret}"]
        commands.initdb([*auth, "--encoding=utf8", "-U", "postgres"], pgdata=data, user=user)
        port = find_suitable_port("127.0.0.1")
        login = "postgres" if password is None else f"postgres:{quote(password, safe='')}"
        server = TemporaryServer(commands, data, log, f"-h 127.0.0.1 -p {port} -k {root} {options}", user,
                                 f"postgresql://{login}@127.0.0.1:{port}/postgres")
        server.start()
        try:
            yield server
        finally:
            try:
                server.stop("fast")
            except Exception:  # noqa: BLE001 - already stopped
                pass
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def temporary_server(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A throw-away PostgreSQL listening on 127.0.0.1 (a free port), built with the embedded server's
    binaries in a temporary directory and started with ``settings`` (``-c name=value``); stopped and
    removed on exit. Yields the DSN of its ``postgres`` database. For tests and benchmarks that need a
    server of their own (a setting that needs a restart, a TCP listener, a server they stop)."""
    with restartable_server(settings) as server:
        yield server.dsn


#: The file in which the embedded server's data folder lists the processes using it (pgserver's).
_USERS_FILE = ".handle_pids.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def _users(pgdata: Path) -> list[int]:
    """The processes recorded as using the server of ``pgdata``."""
    try:
        pids = json.loads((pgdata / _USERS_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [int(p) for p in pids if isinstance(p, int)]


def _forget_dead_users(pgdata: Path) -> None:
    """Drop the processes that ended without saying so (SIGKILL) from the users of the server of
    ``pgdata``: else the server would never stop, the last live user counting them still."""
    users = _users(pgdata)
    alive = [p for p in users if _alive(p)]
    if alive != users:
        (pgdata / _USERS_FILE).write_text(json.dumps(alive))


@dataclass(frozen=True)
class EmbeddedStatus:
    """The embedded server of a data folder: ``pgdata``, whether it is ``running`` (its postmaster's
    ``pid``), the ``dsn`` of its ``postgres`` database when it runs, and ``users``, the live processes
    that use it (it stops when the last one exits; none: kept running by :func:`start_server`)."""

    pgdata: Path
    running: bool
    pid: int | None
    dsn: str | None
    users: tuple[int, ...]


def server_status(pgdata: Path | None = None) -> EmbeddedStatus:
    """The state of the embedded server of ``pgdata`` (default ``home() / "pgdata"``), read from its data
    folder: nothing is started."""
    path = (pgdata or home() / "pgdata").resolve()
    pid: int | None = None
    dsn: str | None = None
    try:
        lines = (path / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        lines = []
    running = pid is not None and _alive(pid)
    if running and len(lines) >= 5:
        port, sockets = lines[3].strip(), lines[4].strip()
        dsn = f"postgresql://postgres:@/postgres?host={sockets}" + (f"&port={port}" if port != "5432" else "")
    users = tuple(p for p in _users(path) if _alive(p)) if running else ()
    return EmbeddedStatus(path, running, pid if running else None, dsn, users)


def start_server(pgdata: Path | None = None) -> str:
    """Start the embedded server of ``pgdata`` (default ``home() / "pgdata"``) unless it runs, and keep it
    running after this process exits (until :func:`stop_server`); return the DSN of its ``postgres``
    database."""
    path = (pgdata or home() / "pgdata").resolve()
    dsn = embedded_dsn(path)
    srv = _servers[path]
    srv.cleanup_mode = None  # this process's exit leaves it running
    users = _users(path)  # and it is no user: the server runs for others
    if os.getpid() in users:
        (path / _USERS_FILE).write_text(json.dumps([p for p in users if p != os.getpid()]))
    return dsn


def stop_server(pgdata: Path | None = None) -> EmbeddedStatus:
    """Stop the embedded server of ``pgdata`` (default ``home() / "pgdata"``) if it runs, whatever uses it
    (their connections end); return its state before (``running``: whether there was one to stop,
    ``users``: the processes that used it)."""
    path = (pgdata or home() / "pgdata").resolve()
    before = server_status(path)
    if before.running:
        with warnings.catch_warnings():  # as in embedded_dsn: platformdirs' warning on import
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR", category=UserWarning)
            from pgserver import _commands  # the binaries' commands, generated when pgserver is imported

        commands: Any = _commands
        user = "pgserver" if os.geteuid() == 0 else None
        commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=path, user=user, timeout=60)
    (path / _USERS_FILE).unlink(missing_ok=True)
    return before
