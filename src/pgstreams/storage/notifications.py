"""LISTEN/NOTIFY wake-up hints.

Notifications only wake consumers early; polling stays the fallback, so a lost notification costs latency,
never correctness. Autocommit publishes do not notify inside their own transaction: a NOTIFY takes a
cluster-wide lock held through commit, which serialises every notifying commit (on the reference machine
8 single-row INSERT clients fell from 13,600 to 3,400 transactions/s). Instead each client has a
:class:`Notifier` service that sends one coalesced ``pg_notify`` after commits, from a read-only transaction
that needs no WAL flush, at most once per :data:`MIN_INTERVAL` (a busy producer sends one notification
for many commits instead of one each). Publishes that join a caller's transaction (``conn=``) notify
inside it. Consumers wait on the client's :class:`Listener` service, one LISTEN connection per client.

Publishers notify only while a consumer waits for the topic (``0027_topic_waiters.sql``): a client about to
wait marks the topic as waited for in the database (:meth:`Listener.waiting`, at most every
:data:`WAITING_REFRESH` s, each mark lasting :data:`WAITING_TTL` s), and a publishing client that read no
such mark with the topic's row sends no notification for that topic until it reads the row again. A mark
that follows a lapse is seen by every publisher within its reading interval; meanwhile the waiter rechecks
every :data:`FAST_RECHECK` s.

Both are :class:`pgstreams.services.Service` loops owned by the client: started on first use (a client
that never publishes sends no notification, one that never waits listens to none) and stopped when it
closes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import psycopg
from psycopg import pq

from ..services import Service
from .libpq import exec_params
from .naming import notification_channel

log = logging.getLogger("pgstreams.notify")

#: Seconds a client's notifier waits after a notification before it sends the next one; commits in
#: between are announced together. A notification costs a server round trip and Python time on the
#: publishing client: without this, one per single-event publish doubled the client's CPU per publish.
MIN_INTERVAL = 0.005

#: How long after a notification the notifier's own thread sends the next one for commits not yet
#: announced; a publish that comes after :data:`MIN_INTERVAL` announces them itself, in its own round trip
#: (see :meth:`Notifier.claim`), which costs far less than waking the thread. So a client publishing
#: steadily sends its notifications with its publishes, and the thread covers the last commits of a burst.
TRAILING_INTERVAL = 2 * MIN_INTERVAL


#: Seconds a client's mark that it waits for a topic lasts in the database (see :meth:`Listener.waiting`).
WAITING_TTL = 30.0

#: Seconds between two marks of the same topic by a client that keeps waiting for it.
WAITING_REFRESH = 10.0

#: While publishers may not have seen a new mark yet, a waiter reads again after this many seconds.
FAST_RECHECK = 0.005


def channel(schema: str) -> str:
    """The notification channel of a schema (named by the storage layer)."""
    return notification_channel(schema)


class Notifier(Service):
    """Sends coalesced notifications of the topics that received events, after their commit.

    Each step waits until :data:`TRAILING_INTERVAL` has passed since the previous notification (sent by
    it or by a publisher, see :meth:`claim`), then sends one for every topic poked meanwhile; between
    steps it sleeps until poked (at most 1 s). Stopping sends what is still pending. A failed
    notification is logged and dropped (consumers poll anyway).
    """

    def __init__(self, connect: Callable[[], psycopg.Connection], schema: str) -> None:
        super().__init__("notifier", interval=1.0)
        self._connect = connect
        self._channel = channel(schema)
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self._last = 0.0
        self._sending = threading.Lock()  # one sender at a time: the service's thread or flush()'s caller

    def poke(self, topic_id: int) -> None:
        """Schedule a notification for ``topic_id`` (non-blocking; starts the service on first use)."""
        with self._lock:
            self._pending.add(topic_id)
        self.start()
        self.wake()

    def claim(self, topic_id: int) -> bool:
        """A publisher is about to commit an event of ``topic_id`` and can send the notification itself,
        after its commit in the same round trip: true if it should (the last notification went out
        :data:`MIN_INTERVAL` ago or more; it counts as sent now), else the notification is scheduled as
        by :meth:`poke`. Sending it from the publisher saves the hand-over to this service's thread and a
        round trip of its own, which a consumer waiting for the first event after a pause would wait for."""
        now = time.monotonic()
        with self._lock:
            if now - self._last >= MIN_INTERVAL:
                self._last = now
                self._pending.discard(topic_id)
                return True
            if topic_id in self._pending:
                return False  # scheduled already: the thread is awake or will be
            self._pending.add(topic_id)
        self.start()
        self.wake()
        return False

    def step(self) -> None:
        while True:  # a publisher may send the notification meanwhile: then wait from its time
            last = self._last
            pause = last + TRAILING_INTERVAL - time.monotonic()
            if pause <= 0:
                break
            if self.stopping.wait(pause):  # stopping cuts the pause short: finish() sends what is pending
                break
            if self._last == last:
                break
        self._send()

    def finish(self) -> None:
        if self.error is None:
            self._send()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def flush(self) -> None:
        """Send the pending notification now, in the caller's thread; on return every notification
        scheduled before the call has been sent (or dropped after a failure, as by the service)."""
        self._send()

    def _send(self) -> None:
        with self._sending:
            self._send_pending()

    def _send_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
        if not pending:
            return
        payload = ",".join(str(t) for t in sorted(pending))
        conn = self._conn
        try:
            if conn is None or conn.closed:
                conn = self._conn = self._connect()
            # straight through libpq: psycopg's execute() costs four times the CPU, which a busy
            # producer pays for every notification
            enc = conn.info.encoding
            res = exec_params(conn.pgconn, b"SELECT pg_notify($1, $2)",
                              [self._channel.encode(enc), payload.encode(enc)])
            if res.status != pq.ExecStatus.TUPLES_OK:
                raise psycopg.OperationalError(
                    (res.error_message or conn.pgconn.error_message).decode(enc, "replace").strip())
            self._last = time.monotonic()
        except psycopg.Error as exc:
            log.warning("notification failed (consumers fall back to polling): %s", exc)
            if conn is not None:
                conn.close()
            self._conn = None
            self.stopping.wait(0.1)


class Listener(Service):
    """One LISTEN connection per client; consumers wait on it for their topic's notifications.

    Each step holds a connection and hands out its notifications until it fails or the service stops.
    A lost connection wakes every waiter (so each polls while disconnected) and is opened again after
    0.1 s, doubling up to 5 s while it keeps failing. :attr:`connected` is set while listening.

    Without ``connect`` (``None``: a client behind a transaction pooler with no ``listen_dsn``, where a
    LISTEN would stay with a server session that serves other clients and its notifications would never
    reach this client) the listener is off (:attr:`enabled` false): it starts no thread, no notification
    comes, every wait lasts its whole timeout and :meth:`wait_for_events` waits ``poll_interval`` seconds at
    most: waiters poll.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection] | None, schema: str,
                 mark: Callable[[int, float], None] | None = None, fast_window: float = 0.0, *,
                 poll_interval: float = 0.25) -> None:
        super().__init__("listener", interval=self._delay)
        self._connect = connect
        self._poll_interval = poll_interval
        self._channel = channel(schema)
        self._cond = threading.Condition()
        self._gens: dict[int, int] = {}
        self._conn: psycopg.Connection | None = None
        self._backoff = 0.1
        self._retry_in = 0.0
        self.connected = threading.Event()
        self._mark = mark
        self._fast_window = fast_window
        self._marked: dict[int, float] = {}  # topic id -> time.monotonic() of this client's last mark
        self._fast: dict[int, float] = {}  # topic id -> recheck fast until this time.monotonic()
        self._mark_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether notifications can come (false: no LISTEN connection, waiters poll)."""
        return self._connect is not None

    def start(self) -> None:
        """Start listening (once; nothing when the listener is off)."""
        if self._connect is not None:
            super().start()

    def waiting(self, topic_id: int) -> bool:
        """A consumer of this client is about to wait for ``topic_id``'s events: mark the topic as waited
        for (with ``mark(topic_id, WAITING_TTL)``, when this client's last mark is :data:`WAITING_REFRESH`
        s old or more), so that publishers notify. True while the waiter should read again after
        :data:`FAST_RECHECK` s instead of waiting for a notification: publishers may not have seen a mark
        that followed a lapse yet (they read it with the topic's row, within ``fast_window`` s), or marking
        failed. Cheap when nothing is due: two dictionary reads. Nothing is marked when the listener is off
        (no notification could wake the waiter)."""
        if self._mark is None or self._connect is None:
            return False
        now = time.monotonic()
        last = self._marked.get(topic_id)
        if last is None or now - last >= WAITING_REFRESH:
            with self._mark_lock:
                last = self._marked.get(topic_id)
                if last is None or now - last >= WAITING_REFRESH:
                    self._mark_now(topic_id, now, last)
        return now < self._fast.get(topic_id, 0.0)

    def _mark_now(self, topic_id: int, now: float, last: float | None) -> None:
        assert self._mark is not None
        try:
            self._mark(topic_id, WAITING_TTL)
        except Exception as exc:  # noqa: BLE001 - a hint: the waiter polls fast and tries again soon
            log.warning("could not mark topic %d as waited for (%s); polling every %g s meanwhile",
                        topic_id, exc, FAST_RECHECK)
            self._marked[topic_id] = now - WAITING_REFRESH + 1.0  # again in a second
            self._fast[topic_id] = now + 1.0
            return
        done = time.monotonic()
        self._marked[topic_id] = done
        if last is None or now - last > WAITING_TTL - WAITING_REFRESH:  # the previous mark may have lapsed
            self._fast[topic_id] = done + self._fast_window

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

    def generations(self, topic_ids: Iterable[int]) -> dict[int, int]:
        """:meth:`generation` of each of ``topic_ids``."""
        with self._cond:
            return {tid: self._gens.get(tid, 0) for tid in topic_ids}

    def wait_any(self, generations: Mapping[int, int], timeout: float) -> bool:
        """Wait up to ``timeout`` s for a notification about any topic of ``generations`` (topic id ->
        :meth:`generation`) newer than its generation there."""
        self.start()
        deadline = time.monotonic() + timeout
        with self._cond:
            while all(self._gens.get(tid, 0) == gen for tid, gen in generations.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def wait_for_events(self, generations: Mapping[int, int], left: float, recheck: float) -> float:
        """A reader found no new event on the topics of ``generations`` (read with them): wait up to
        ``left`` s for a notification about any of them, marking each as waited for; return the cap of the
        next wait (``recheck``: this one's, 0 for none). After a notification whose events the read did
        not find (still behind the read fence of an open transaction, or announced a little before their
        commit) it reads again after 2 ms, then 4 ms, ... up to 0.1 s. When the listener is off, each wait
        lasts ``poll_interval`` at most (the reader polls)."""
        wait = min(left, recheck) if recheck else left
        if self._connect is None:
            wait = min(wait, self._poll_interval)
        if any([self.waiting(tid) for tid in generations]):  # publishers may not know of the waiter yet
            wait = min(wait, FAST_RECHECK)
        if self.wait_any(generations, wait):
            return min(recheck * 2, 0.1) if recheck else 0.002
        return min(recheck * 2, 0.1) if recheck else 0.0

    def request_stop(self) -> None:
        super().request_stop()
        conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass

    def _delay(self) -> float:
        return self._retry_in

    def _signal(self, payload: str) -> None:
        ids = []
        for part in payload.split(","):
            if part.strip().isdigit():
                ids.append(int(part))
        with self._cond:
            for tid in ids:
                self._gens[tid] = self._gens.get(tid, 0) + 1
            self._cond.notify_all()

    def step(self) -> None:
        self._retry_in = 0.0
        assert self._connect is not None  # an enabled listener's thread only
        try:
            conn = self._connect()
            self._conn = conn
            with conn:
                conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._channel)))
                self.connected.set()
                self._backoff = 0.1
                while not self.stopping.is_set():
                    for n in conn.notifies(timeout=0.5):
                        self._signal(n.payload)
        except Exception as exc:  # noqa: BLE001 - reconnect on any failure
            self.connected.clear()
            if self.stopping.is_set():
                return
            log.warning("listener connection lost (%s); reconnecting in %.1fs", exc, self._backoff)
            # wake every waiter so it polls while we are disconnected
            with self._cond:
                for tid in list(self._gens):
                    self._gens[tid] += 1
                self._cond.notify_all()
            self._retry_in = self._backoff  # the service waits this long (stopping cuts it short)
            self._backoff = min(self._backoff * 2, 5.0)
        finally:
            self._conn = None
