"""Helpers of the commands that serve until stopped (``metrics serve``, ``console``): loading an optional
extra with a clear error, and waiting for SIGINT/SIGTERM."""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, ModuleType

from .common import TERMINATING, CliError, usage_error


def load_extra(module: str, extra: str) -> ModuleType:
    """Import ``module`` of an optional extra, or fail with the command to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CliError(f"{module} needs the '{extra}' extra ({exc}): "
                       f'pip install "pgstreams[{extra}]"') from None


def check_port(option: str, port: int) -> None:
    """A TCP port (0: any free one)."""
    if not 0 <= port <= 65535:
        raise usage_error(f"{option} must be a port from 0 to 65535, not {port}")


def wait_for_signal(until: Callable[[], bool] | None = None) -> None:
    """Block until SIGINT or SIGTERM (main thread only), or until ``until()`` is true (checked twice a
    second)."""
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # a SIGTERM that came before (its exception lost on the way) stops it too
        while not TERMINATING.is_set() and not stop.wait(0.5):
            if until is not None and until():
                return
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def listening(host: str, port: int) -> Iterator[None]:
    """Turn the failure to listen on ``host:port`` (a port in use, an address not of this machine) into
    one line that names the address: ``cannot listen on HOST:PORT: reason`` (exit code 1)."""
    try:
        yield
    except OSError as exc:
        shown = f"[{host}]" if ":" in host else host
        raise CliError(f"cannot listen on {shown}:{port}: {exc.strerror or exc}") from None
