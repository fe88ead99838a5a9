"""Named SQL queries: one loader for every namespace (the core, the Spark data source, applications).

A query file holds queries separated by ``-- name: NAME`` lines. ``{schema}`` stands for the schema (a
quoted identifier) and other ``{placeholders}`` for identifiers the caller supplies (a topic's table,
...); literal braces are doubled. Values are always bound parameters (``%s`` / ``%(name)s``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources

from psycopg import sql

from ..errors import PgStreamsError
from ..names import check_schema

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


class QueryNotFound(PgStreamsError, LookupError):
    """A named query does not exist in its query set (a programming error)."""


def parse(text: str, origin: str = "<text>") -> dict[str, str]:
    """The queries of one file's ``text`` by name (comments before the first name are ignored)."""
    parts = _NAME_RE.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in out:
            raise ValueError(f"{origin}: query {name!r} is defined twice")
        out[name] = body.strip().rstrip(";")
    return out


class QuerySet:
    """The named queries of a package's ``.sql`` files, read once.

    ``package`` is the package holding them and ``path`` the file or folder inside it (every ``*.sql``
    file of a folder, in name order; a name may be defined once across them).
    """

    def __init__(self, package: str, *path: str) -> None:
        self.package = package
        self.path = path

    def __repr__(self) -> str:
        return f"<QuerySet {self.package}:{'/'.join(self.path)}>"

    @functools.cached_property
    def _texts(self) -> dict[str, str]:
        entry = resources.files(self.package).joinpath(*self.path)
        files = sorted((e for e in entry.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name) \
            if entry.is_dir() else [entry]
        out: dict[str, str] = {}
        for f in files:
            for name, body in parse(f.read_text("utf-8"), f.name).items():
                if name in out:
                    raise ValueError(f"{self}: query {name!r} is defined twice")
                out[name] = body
        return out

    def names(self) -> list[str]:
        """Every query name, sorted."""
        return sorted(self._texts)

    def text(self, name: str) -> str:
        """The raw text of query ``name`` (placeholders not yet filled in)."""
        try:
            return self._texts[name]
        except KeyError:
            raise QueryNotFound(f"{self}: no query named {name!r}") from None

    def render(self, name: str, schema: str, identifiers: Mapping[str, sql.Composable] | None = None
               ) -> sql.Composed:
        """Query ``name`` with ``{schema}`` as the quoted ``schema`` and each of ``identifiers`` filled in
        (not cached: see :meth:`get` for the cached form of the common cases)."""
        params: dict[str, sql.Composable] = {"schema": sql.Identifier(schema)}
        if identifiers:
            params.update(identifiers)
        return sql.SQL(self.text(name)).format(**params)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - query sets live as long as the process
    def get(self, name: str, schema: str) -> sql.Composed:
        """Query ``name`` for ``schema`` (cached)."""
        return self.render(name, schema)


def render_script(text: str, schema: str) -> sql.Composed:
    """A whole SQL script (a migration) for ``schema``: ``{schema}`` as the quoted identifier and
    ``{schema_raw}`` as the bare name (for use inside string literals; schema names are validated to
    ``[A-Za-z_][A-Za-z0-9_]*`` first, so it needs no quoting)."""
    check_schema(schema)
    return sql.SQL(text).format(schema=sql.Identifier(schema),
                                schema_raw=sql.SQL(schema))
