"""Handlers: loading and checking them, and calling one on a chunk of events."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ..errors import InvalidArgument
from ..models import Event

Handler = Callable[..., Any]


class EventFailed(Exception):
    """Raise from a batch handler to say which event of the batch failed (``cause``: why).

    The events before it count as handled (committed in at-least-once mode; delivered again without the
    failing one in transactional mode, where the whole batch rolled back); only ``event`` is retried and,
    when its attempts are spent, dead-lettered. Any other exception fails the batch as a whole: it is
    retried, and when its attempts are spent its events are delivered one by one to find the failing ones.
    """

    def __init__(self, event: Event, cause: BaseException | None = None) -> None:
        super().__init__(f"event {event.topic}[{event.partition}]@{event.position} failed"
                         + (f": {type(cause).__name__}: {cause}" if cause else ""))
        self.event = event
        self.cause = cause


def is_async(handler: object) -> bool:
    """Whether ``handler`` is an ``async def`` function (or an object whose ``__call__`` is one)."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None  # a callable object
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


class _EventLoopThread:
    """The event loop the ``async def`` handlers of this process run on: one daemon thread, started on
    first use (runners wait for their handler's coroutine, so each runner has one running at a time)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pgstreams-async-handlers",
                                 daemon=True).start()
                cls._loop = loop
            return cls._loop


class AsyncHandler:
    """An ``async def`` handler made callable by the runner: each call runs the coroutine on the
    process's handler event loop (a thread of its own) and waits for it; its exception is the call's."""

    def __init__(self, handler: Callable[..., Awaitable[Any]]) -> None:
        self.handler = handler
        self.__qualname__ = getattr(handler, "__qualname__", type(handler).__name__)

    def __call__(self, *args: Any) -> Any:
        coro = self.handler(*args)
        return asyncio.run_coroutine_threadsafe(coro, _EventLoopThread.loop()).result()  # type: ignore[arg-type]


def as_called(handler: Handler) -> Handler:
    """``handler`` as the runner calls it: an ``async def`` one wrapped in an :class:`AsyncHandler`."""
    return AsyncHandler(handler) if is_async(handler) else handler


def check_handler(handler: object, batch: bool, mode: str) -> None:
    """Refuse a handler that cannot be called the way ``batch`` and ``mode`` call it: every call would
    fail (and every event end in the dead-letter topic). ``async def`` handlers are accepted (see
    :class:`AsyncHandler`)."""
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, not {type(handler).__name__}")
    name = getattr(handler, "__qualname__", None) or type(handler).__name__
    args = ("events" if batch else "event",) + (("conn",) if mode == "transactional" else ())
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to check (some builtins): calls will tell
        return
    try:
        sig.bind(*args)
    except TypeError:
        bare = sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=sig.empty)
        raise InvalidArgument(
            f"handler {name}{bare} cannot be called as handler({', '.join(args)}), as "
            f"batch={batch} and mode={mode!r} call it") from None


def load_handler(spec: str) -> Handler:
    """Import a handler named ``"package.module:function"`` (the function may be a dotted attribute path)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise InvalidArgument(f"handler must be written MODULE:FUNCTION, got {spec!r}")
    mod_name, attr = spec.split(":")
    if not mod_name or not attr:
        raise InvalidArgument(f"handler must be written MODULE:FUNCTION, got {spec!r}")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import handler module {mod_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument(f"module {mod_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise InvalidArgument(f"handler {spec!r} is not callable")
    return obj


@dataclass
class Attempt:
    """What one call of the handler on a chunk did: the first ``done`` events were handled; ``index`` is
    the chunk index of the failing event (``None``: none failed, or the chunk failed as a whole) and
    ``error`` why; ``interrupted`` when a single-event handler stopped early because the partition of the
    next event was lost."""

    done: int
    index: int | None = None
    error: BaseException | None = None
    interrupted: bool = False


def call_handler(handler: Handler, chunk: Sequence[Event], conn: psycopg.Connection | None, *, batch: bool,
                 owns: Callable[..., bool]) -> Attempt:
    """Call ``handler`` on ``chunk``: once with the list (``batch``), else per event, going on to each
    next event only while ``owns({partition}, leaving_ok=True)`` (see :meth:`Source.owns`). With ``conn``
    (transactional mode) the handler also gets the connection, each call in a savepoint. A handler
    exception is the attempt's error; a connection broken meanwhile is raised as
    :class:`psycopg.OperationalError`."""
    if not batch:
        for i, ev in enumerate(chunk):
            if i and not owns({ev.partition}, leaving_ok=True):
                return Attempt(i, interrupted=True)
            try:
                if conn is None:
                    handler(ev)
                else:
                    with conn.transaction():
                        handler(ev, conn)
            except Exception as exc:
                if conn is not None and conn.broken:
                    raise psycopg.OperationalError("connection lost while handling an event") from exc
                return Attempt(i, i, exc)
        return Attempt(len(chunk))
    try:
        if conn is None:
            handler(list(chunk))
        else:
            with conn.transaction():
                handler(list(chunk), conn)
    except EventFailed as exc:
        cause: BaseException = exc.cause or exc
        at = next((i for i, e in enumerate(chunk) if e.partition == exc.event.partition
                   and e.position == exc.event.position), None)
        if at is None:
            return Attempt(0, 0 if len(chunk) == 1 else None, cause)
        return Attempt(at if conn is None else 0, at, cause)  # transactional: the whole batch rolled back
    except Exception as exc:
        if conn is not None and conn.broken:
            raise psycopg.OperationalError("connection lost while handling a batch") from exc
        return Attempt(0, 0 if len(chunk) == 1 else None, exc)
    return Attempt(len(chunk))
