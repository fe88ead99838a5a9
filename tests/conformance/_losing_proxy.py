"""A Kafka-aware TCP proxy on loopback for the conformance tests: it forwards a client's requests to a
broker and the broker's responses back, frame by frame, except that the response to the first ``Produce``
request naming a topic ``NAME_idem`` is lost, for each such topic: the proxy closes that client's
connection instead, as a network failure would after the broker stored the batch. An idempotent producer
then sends the batch again; the broker must store it once."""

from __future__ import annotations

import re
import socket
import struct
import threading
import time

#: A topic whose first produce response is lost.
_LOSE = re.compile(rb"[a-z]+_idem")
_PRODUCE = 0


def _frame(sock: socket.socket) -> bytes | None:
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    body = sock.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
    return head + body


class LosingProxy:
    """Listens on a free loopback port (:attr:`address`) and forwards to :attr:`target` (``HOST:PORT``,
    set before the first client connects)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.target: str | None = None
        self.lost: set[bytes] = set()  # the topics whose produce response was lost
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="losing-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        """Connect ``client`` to the target, trying again for up to 30 s while it refuses (a broker being
        restarted), as a client itself would; then forward both ways."""
        assert self.target is not None, "the proxy's target is not set"
        host, port = self.target.rsplit(":", 1)
        deadline = time.monotonic() + 30
        while True:
            try:
                server = socket.create_connection((host, int(port)), timeout=5)
                server.settimeout(None)
                break
            except OSError:
                if time.monotonic() > deadline:
                    client.close()
                    return
                time.sleep(0.05)  # polling for the broker's port, with a deadline
        with self._lock:
            self._sockets += [client, server]
        losing: dict[int, bytes] = {}  # correlation id -> topic, of the requests whose reply is lost
        threading.Thread(target=self._requests, args=(client, server, losing), daemon=True).start()
        threading.Thread(target=self._responses, args=(client, server, losing), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, losing: dict[int, bytes]) -> None:
        try:
            while (frame := _frame(client)) is not None:
                key, _version, correlation = struct.unpack(">hhi", frame[4:12])
                found = _LOSE.search(frame) if key == _PRODUCE else None
                if found is not None:
                    with self._lock:
                        if found.group() not in self.lost and found.group() not in losing.values():
                            losing[correlation] = found.group()
                server.sendall(frame)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _responses(self, client: socket.socket, server: socket.socket, losing: dict[int, bytes]) -> None:
        try:
            while (frame := _frame(server)) is not None:
                (correlation,) = struct.unpack(">i", frame[4:8])
                with self._lock:
                    topic = losing.pop(correlation, None)
                    if topic is not None and topic not in self.lost:
                        self.lost.add(topic)
                        break  # the response is lost: the connection goes down instead
                client.sendall(frame)
        except OSError:
            pass
        finally:
            _close(client, server)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                _close(s)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
