"""LISTEN/NOTIFY wake-up hints.

Notifications only wake consumers early; polling stays the fallback, so a lost notification costs latency,
never correctness. Autocommit publishes do not notify inside their own transaction: a NOTIFY takes a
cluster-wide lock held through commit, which serialises every notifying commit (on the reference machine
8 single-row INSERT clients fell from 13,600 to 3,400 transactions/s). Instead each client has a
:class:`Notifier` thread that sends one coalesced ``pg_notify`` after commits, from a read-only transaction
that needs no WAL flush, at most once per :data:`MIN_INTERVAL` (a busy producer sends one notification
for many commits instead of one each). Publishes that join a caller's transaction (``conn=``) notify
inside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
from psycopg import pq

from .storage import notification_channel

log = logging.getLogger("pgstreams.notify")

#: Seconds a client's notifier waits after a notification before it sends the next one; commits in
#: between are announced together. A notification costs a server round trip and Python time on the
#: publishing client: without this, one per single-event publish doubled the client's CPU per publish.
MIN_INTERVAL = 0.005


def channel(schema: str) -> str:
    """The notification channel of a schema (named by the storage layer)."""
    return notification_channel(schema)


class Notifier:
    """Sends coalesced notifications of the topics that received events, after their commit."""

    def __init__(self, connect: Callable[[], psycopg.Connection], schema: str) -> None:
        self._connect = connect
        self._channel = channel(schema)
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def poke(self, topic_id: int) -> None:
        """Schedule a notification for ``topic_id`` (non-blocking)."""
        with self._lock:
            self._pending.add(topic_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgstreams-notifier", daemon=True)
                self._thread.start()
        if not self._wake.is_set():  # set: the notifier has not taken the pending set yet
            self._wake.set()

    def close(self) -> None:
        """Flush pending notifications and stop the thread."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        last = 0.0
        while True:
            self._wake.wait(timeout=1.0)
            pause = last + MIN_INTERVAL - time.monotonic()
            if pause > 0 and not self._stop:
                time.sleep(pause)
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, set()
            if pending:
                payload = ",".join(str(t) for t in sorted(pending))
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    # straight through libpq: psycopg's execute() costs four times the CPU, which a busy
                    # producer pays for every notification
                    enc = conn.info.encoding
                    res = conn.pgconn.exec_params(
                        b"SELECT pg_notify($1, $2)", [self._channel.encode(enc), payload.encode(enc)])
                    if res.status != pq.ExecStatus.TUPLES_OK:
                        raise psycopg.OperationalError(
                            (res.error_message or conn.pgconn.error_message).decode(enc, "replace").strip())
                    last = time.monotonic()
                except psycopg.Error as exc:
                    log.warning("notification failed (consumers fall back to polling): %s", exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(0.1)
            if self._stop:
                break
        if conn is not None:
            conn.close()


class Listener:
    """One LISTEN connection per client; consumers wait on it for their topic's notifications."""

    def __init__(self, connect: Callable[[], psycopg.Connection], schema: str) -> None:
        self._connect = connect
        self._channel = channel(schema)
        self._cond = threading.Condition()
        self._gens: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        self.connected = threading.Event()

    def start(self) -> None:
        """Start listening (idempotent)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgstreams-listener", daemon=True)
                self._thread.start()

    def generation(self, topic_id: int) -> int:
        """A counter that grows with every notification about ``topic_id``."""
        with self._cond:
            return self._gens.get(topic_id, 0)

    def wait(self, topic_id: int, generation: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a notification about ``topic_id`` newer than ``generation``."""
        self.start()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._gens.get(topic_id, 0) == generation:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self) -> None:
        """Stop listening."""
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _signal(self, payload: str) -> None:
        ids = []
        for part in payload.split(","):
            if part.strip().isdigit():
                ids.append(int(part))
        with self._cond:
            for tid in ids:
                self._gens[tid] = self._gens.get(tid, 0) + 1
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                conn = self._connect()
                self._conn = conn
                with conn:
                    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._channel)))
                    self.connected.set()
                    backoff = 0.1
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=0.5):
                            self._signal(n.payload)
            except Exception as exc:  # noqa: BLE001 - reconnect on any failure
                self.connected.clear()
                if self._stop.is_set():
                    break
                log.warning("listener connection lost (%s); reconnecting in %.1fs", exc, backoff)
                # wake every waiter so it polls while we are disconnected
                with self._cond:
                    for tid in list(self._gens):
                        self._gens[tid] += 1
                    self._cond.notify_all()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self._conn = None
