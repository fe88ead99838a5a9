"""A TCP proxy of the tests' own on loopback, in front of a server: :meth:`CuttingProxy.cut` closes the
server side of one client connection and leaves its client side open and silent; :meth:`blackhole` keeps
both sides open and drops what the connection carries (one way or both), and can drop every new
connection too, as a network partition does."""

from __future__ import annotations

import socket
import threading

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


class _Pair:
    """A client connection and the proxy's connection to the server for it."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.port = int(client.getpeername()[1])
        self.cut = False
        self.dropping: set[socket.socket] = set()  # the sockets whose reads are dropped, not forwarded


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 to the server of ``dsn``; :attr:`dsn` is ``dsn`` through the proxy."""

    def __init__(self, dsn: str) -> None:
        info = conninfo_to_dict(dsn)
        host = str(info.get("host") or "/var/run/postgresql")
        port = int(info.get("port") or 5432)
        if host.startswith("/"):
            self._family, self._address = socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
        else:
            self._family, self._address = socket.AF_INET, (host, port)  # type: ignore[assignment]
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=self._listener.getsockname()[1])
        self._pairs: list[_Pair] = []
        self._swallowed: list[socket.socket] = []
        self._lock = threading.Lock()
        self.drop_new = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.drop_new:  # accepted, and never answered
                with self._lock:
                    self._swallowed.append(client)
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            server = socket.socket(self._family, socket.SOCK_STREAM)
            server.connect(self._address)
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, server, client), daemon=True).start()

    @staticmethod
    def _swallow(sock: socket.socket) -> None:
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass

    @staticmethod
    def _pump(pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if pair.cut:
                    break
                if src not in pair.dropping:
                    dst.sendall(data)
        except OSError:
            pass
        if not pair.cut:
            for s in (pair.client, pair.server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self, client_port: int) -> None:
        """End the server side of the connection from local port ``client_port``; its client side stays
        open and silent."""
        with self._lock:
            pair = next(p for p in self._pairs if p.port == client_port)
        pair.cut = True
        pair.server.shutdown(socket.SHUT_RDWR)
        pair.server.close()

    def blackhole(self, client_port: int | None = None, *, to_server: bool = True, to_client: bool = True,
                  new: bool = False) -> None:
        """Drop, without closing anything, what the connection from local port ``client_port`` (every
        connection: ``None``) carries to the server and/or to the client; with ``new``, accept new
        connections and never answer them."""
        self.drop_new = self.drop_new or new
        with self._lock:
            pairs = [p for p in self._pairs if client_port is None or p.port == client_port]
        assert pairs, f"no connection from port {client_port}"
        for p in pairs:
            if to_server:
                p.dropping.add(p.client)
            if to_client:
                p.dropping.add(p.server)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for p in self._pairs:
                for s in (p.client, p.server):
                    s.close()
            for s in self._swallowed:
                s.close()


def local_port(conn: psycopg.Connection) -> int:
    """The local port of ``conn``'s socket (the proxy names a connection by it)."""
    with socket.socket(fileno=conn.pgconn.socket) as s:
        try:
            return int(s.getsockname()[1])
        finally:
            s.detach()
