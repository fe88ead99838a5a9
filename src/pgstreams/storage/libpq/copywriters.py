"""psycopg's COPY writers (sync and on the event loop) with every wait for the server bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import pq

from .waits import OK, await_input_async, check_alive, flush, flush_async, next_result

#: Bytes of COPY data handed to libpq at once (psycopg splits larger buffers likewise).
_COPY_CHUNK = 128 * 1024
#: Bytes of COPY data queued in libpq before they are flushed to the server (psycopg's own cadence: the
#: server stores the first rows of a batch while the client still encodes the next).
_COPY_FLUSH = 32 * 1024


def _copy_end_message(exc: BaseException | None, encoding: str) -> bytes | None:
    if exc is None:
        return None
    return f"error from Python: {type(exc).__qualname__} - {exc}".encode(encoding, "replace")


def _copy_end_result(pg: pq.abc.PGconn, res: pq.abc.PGresult | None, message: bytes | None,
                     encoding: str) -> None:
    """Raise the error of the COPY's result, unless it is the cancellation ``message`` asked for (the
    Python error that caused it is the one raised)."""
    if res is None:
        check_alive(pg)
        raise psycopg.OperationalError("the server sent no result for the COPY")
    if res.status == pq.ExecStatus.COMMAND_OK:
        return
    if message is not None and res.error_field(pq.DiagnosticField.SQLSTATE) == b"57014":
        return
    raise psycopg.errors.error_from_result(res, encoding=encoding)


class CopyWriter(psycopg.copy.Writer):
    """psycopg's COPY writer, with every wait bounded as :func:`flush` and :func:`await_input` bound
    theirs (psycopg's own waits for the socket have no bound: a connection cut silently during a COPY
    would hold it forever)."""

    def __init__(self, pg: pq.abc.PGconn, encoding: str, started: bool = True) -> None:
        self._pg = pg
        self._encoding = encoding
        self._queued = 0
        self._started = started

    def _start(self) -> None:
        """Wait until the query sent on the connection has started its COPY (``started=False``): read the
        results of the statements before it, and raise the first error among them (the server then ran
        no COPY)."""
        pg = self._pg
        failed: pq.abc.PGresult | None = None
        while True:
            res = next_result(pg)
            if res is None:
                check_alive(pg)
                if failed is not None:
                    raise psycopg.errors.error_from_result(failed, encoding=self._encoding)
                raise psycopg.ProgrammingError("the query did not start a COPY")
            if res.status == pq.ExecStatus.COPY_IN:
                break
            if res.status not in OK and failed is None:
                failed = res
        self._started = True

    def write(self, data: Any) -> None:
        """Queue ``data`` (COPY data) in libpq, flushing it to the server every :data:`_COPY_FLUSH` bytes."""
        if not self._started:
            self._start()
        view = memoryview(data)
        for i in range(0, len(view), _COPY_CHUNK):
            chunk = view[i:i + _COPY_CHUNK]
            while not self._pg.put_copy_data(chunk):
                flush(self._pg, force=True)
            self._queued += len(chunk)
            if self._queued >= _COPY_FLUSH:
                self._queued = 0
                flush(self._pg)

    def finish(self, exc: BaseException | None = None) -> None:
        """End the COPY (with an error message when ``exc``: the server cancels it) and read its result."""
        pg = self._pg
        if exc is not None and pg.status != pq.ConnStatus.OK:
            return  # the connection is gone (closed by a bounded wait): exc is the error to raise
        if not self._started:
            try:
                self._start()
            except psycopg.Error:
                if exc is None:
                    raise
                return  # no COPY ran: exc is the error to raise
        message = _copy_end_message(exc, self._encoding)
        while not pg.put_copy_end(message):
            flush(pg, force=True)
        _copy_end_result(pg, next_result(pg), message, self._encoding)


class AsyncCopyWriter(psycopg.copy.AsyncWriter):
    """:class:`CopyWriter` on the event loop."""

    def __init__(self, pg: pq.abc.PGconn, encoding: str) -> None:
        self._pg = pg
        self._encoding = encoding
        self._queued = 0

    async def write(self, data: Any) -> None:
        """Queue ``data`` (COPY data) in libpq, flushing it to the server every :data:`_COPY_FLUSH` bytes."""
        pg = self._pg
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        for i in range(0, len(view), _COPY_CHUNK):
            chunk = view[i:i + _COPY_CHUNK]
            while not pg.put_copy_data(chunk):
                await flush_async(loop, pg, pg.socket, force=True)
            self._queued += len(chunk)
            if self._queued >= _COPY_FLUSH:
                self._queued = 0
                await flush_async(loop, pg, pg.socket)

    async def finish(self, exc: BaseException | None = None) -> None:
        """End the COPY (with an error message when ``exc``: the server cancels it) and read its result."""
        pg = self._pg
        loop = asyncio.get_running_loop()
        if exc is not None and pg.status != pq.ConnStatus.OK:
            return  # the connection is gone (closed by a bounded wait): exc is the error to raise
        fd = pg.socket
        message = _copy_end_message(exc, self._encoding)
        while not pg.put_copy_end(message):
            await flush_async(loop, pg, fd, force=True)
        await flush_async(loop, pg, fd)
        while pg.is_busy():
            await await_input_async(loop, pg, fd)
        _copy_end_result(pg, pg.get_result(), message, self._encoding)
