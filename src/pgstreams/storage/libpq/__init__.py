"""Hot statements run straight through libpq: prepared once per connection, sent in one pipeline.

psycopg's query layer (rendering a composed query, converting ``%(name)s`` placeholders, adapting lists,
its pipeline bookkeeping) costs several times the client CPU of the round trip it serves on the hottest
paths (a poll that finds a few events, a single publish). Here a statement is rendered once, its
placeholders become ``$n``, its parameters are sent as text, and its rows are loaded by psycopg's own
(compiled) loaders through a :class:`psycopg.adapt.Transformer`.

- :mod:`.statements`: :class:`Statement` and its rendering, parameters in text form;
- :mod:`.waits`: every wait for the server bounded (socket waits, the silence probe), and result readers;
- :mod:`.direct`: the sync :class:`Direct` and the statement helpers on psycopg connections;
- :mod:`.asyncdirect`: :class:`AsyncDirect`, its asyncio twin;
- :mod:`.copywriters`: COPY writers with bounded waits;
- :mod:`.pools`: :class:`CheckedPool` and :class:`AsyncCheckedPool`, whose checks wait a bounded time.
"""

from __future__ import annotations

from .asyncdirect import AsyncDirect, Send
from .copywriters import AsyncCopyWriter, CopyWriter
from .direct import Direct, collect_statements, exec_params, send_statements, usable
from .pools import CHECK_TIMEOUT, AsyncCheckedPool, CheckedPool, check
from .statements import Statement, Step, int_array, statement, statement_of, text_params
from .waits import DEFAULT_WAIT_LIMIT, PROBE_TIMEOUT, SILENCE_PROBE, wait_limit

__all__ = [
    "CHECK_TIMEOUT",
    "DEFAULT_WAIT_LIMIT",
    "PROBE_TIMEOUT",
    "SILENCE_PROBE",
    "AsyncCheckedPool",
    "AsyncCopyWriter",
    "AsyncDirect",
    "CheckedPool",
    "CopyWriter",
    "Direct",
    "Send",
    "Statement",
    "Step",
    "check",
    "collect_statements",
    "exec_params",
    "int_array",
    "send_statements",
    "statement",
    "statement_of",
    "text_params",
    "usable",
    "wait_limit",
]
