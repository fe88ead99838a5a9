"""The web console (the optional ``console`` extra: ``pip install "pgstreams[console]"``): server-rendered
pages of topics, events, groups and dead letters, live-updating, with dead-letter replay.

``pgstreams console`` serves it; :func:`create_app` returns the ASGI application for any ASGI server.
It depends on the core's public API; the core imports nothing of it. See ``docs/console.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .defaults import (
    DEFAULT_CONSOLE_HOST,
    DEFAULT_CONSOLE_PORT,
    DEFAULT_HISTORY_MINUTES,
    DEFAULT_REFRESH,
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
)
from .security import Credentials, check_binding, is_loopback

if TYPE_CHECKING:
    from .app import create_app

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        # the application needs Starlette and Jinja2: imported on first use
        if name == "create_app":
            from .app import create_app

            return create_app
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_CONSOLE_HOST",
    "DEFAULT_CONSOLE_PORT",
    "DEFAULT_HISTORY_MINUTES",
    "DEFAULT_REFRESH",
    "PASSWORD_ENV",
    "TOKEN_ENV",
    "USER_ENV",
    "Credentials",
    "check_binding",
    "create_app",
    "is_loopback",
]
