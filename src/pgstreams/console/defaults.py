"""The defaults of the web console (importable without its web framework, for help texts)."""

from __future__ import annotations

#: Where ``pgstreams console`` listens by default (loopback only).
DEFAULT_CONSOLE_HOST = "127.0.0.1"
#: The default port of ``pgstreams console``.
DEFAULT_CONSOLE_PORT = 8090
#: Seconds between the pages' live updates and between the status samples behind the charts.
DEFAULT_REFRESH = 3.0
#: Minutes of status samples the charts show.
DEFAULT_HISTORY_MINUTES = 10
#: Environment variables holding the console's credentials: a token, or a user name and password.
TOKEN_ENV = "PGSTREAMS_CONSOLE_TOKEN"
USER_ENV = "PGSTREAMS_CONSOLE_USER"
PASSWORD_ENV = "PGSTREAMS_CONSOLE_PASSWORD"
