"""A decoder of the messages of PostgreSQL's built-in ``pgoutput`` plugin, protocol version 1 (the logical
replication protocol's message formats), as ``pg_logical_slot_peek_binary_changes`` returns them: one
message per row.

Decoded: Begin, Commit, Relation, Insert, Update, Delete, Truncate and logical decoding messages
(``pg_logical_emit_message``, sent with the option ``messages 'true'``, PostgreSQL 14 and later); Origin
and Type are skipped (:func:`decode` returns ``None``). Tuple values are in the text format (what protocol
1 sends); a value left out of an update because it is TOASTed and did not change is :data:`UNCHANGED`, never
``None`` (which is SQL NULL).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, Union

#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
PG_EPOCH_US: Final = 946_684_800_000_000


class _Unchanged:
    """The value of a TOASTed column an update did not change (the server does not send it)."""

    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


#: The one value of an unchanged TOASTed column in a decoded tuple.
UNCHANGED: Final = _Unchanged()

#: A decoded tuple: one text value per column, ``None`` for NULL, :data:`UNCHANGED` for a TOASTed value an
#: update left as it was.
Tuple = tuple[Union[str, _Unchanged, None], ...]


class DecodeError(ValueError):
    """A message that is not pgoutput protocol 1."""


@dataclass(frozen=True)
class Column:
    """A column of a :class:`Relation`: ``name``, ``type_oid``, ``type_modifier`` and ``key`` (part of
    the replica identity)."""

    name: str
    type_oid: int
    type_modifier: int
    key: bool


@dataclass(frozen=True)
class Relation:
    """A table as the server describes it before the first change of it in a decoding (and again after
    its columns changed)."""

    oid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class Begin:
    """The start of a source transaction: its commit's position ``final_lsn``, ``commit_time`` (µs since
    the Unix epoch) and ``xid``."""

    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True)
class Commit:
    """The end of a source transaction: ``commit_lsn`` (its commit record), ``end_lsn`` (the position
    after it: a capture confirmed there has this transaction), ``commit_time`` (µs since the Unix
    epoch)."""

    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True)
class Insert:
    """A row inserted into relation ``relation`` (oid)."""

    relation: int
    new: Tuple


@dataclass(frozen=True)
class Update:
    """A row updated in relation ``relation``: ``old`` is its replica identity's columns before (when the
    key changed, ``old_is_key``) or the whole old row (``REPLICA IDENTITY FULL``), else ``None``."""

    relation: int
    old: Tuple | None
    old_is_key: bool
    new: Tuple


@dataclass(frozen=True)
class Delete:
    """A row deleted from relation ``relation``: its key columns (``old_is_key``, the others ``None``) or
    the whole row (``REPLICA IDENTITY FULL``)."""

    relation: int
    old: Tuple
    old_is_key: bool


@dataclass(frozen=True)
class Truncate:
    """Relations (oids) truncated together; ``cascade``, ``restart_identity`` as the statement said."""

    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class LogicalMessage:
    """A logical decoding message (``pg_logical_emit_message``): ``transactional`` (decoded in its
    transaction, at its commit) or not, its WAL position ``lsn``, ``prefix`` and ``content``."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = Union[Begin, Commit, Relation, Insert, Update, Delete, Truncate, LogicalMessage]

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_BEGIN = struct.Struct("!qqI")
_COMMIT = struct.Struct("!bqqq")
_COLUMN = struct.Struct("!Ii")
_MESSAGE = struct.Struct("!bq")


def _string(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(0, at)
    return data[at:end].decode("utf-8"), end + 1


def _tuple(data: bytes, at: int) -> tuple[Tuple, int]:
    (count,) = _I16.unpack_from(data, at)
    at += 2
    values: list[str | _Unchanged | None] = []
    append = values.append
    for _ in range(count):
        kind = data[at]
        at += 1
        if kind == 0x74:  # 't': text
            (size,) = _I32.unpack_from(data, at)
            at += 4
            append(data[at:at + size].decode("utf-8"))
            at += size
        elif kind == 0x6E:  # 'n': null
            append(None)
        elif kind == 0x75:  # 'u': unchanged TOASTed value
            append(UNCHANGED)
        else:
            raise DecodeError(f"unknown tuple value kind {chr(kind)!r} (binary values need protocol 2+)")
    return tuple(values), at


def _relation(data: bytes) -> Relation:
    (oid,) = _U32.unpack_from(data, 1)
    schema, at = _string(data, 5)
    name, at = _string(data, at)
    identity = chr(data[at])
    (count,) = _I16.unpack_from(data, at + 1)
    at += 3
    columns = []
    for _ in range(count):
        flags = data[at]
        column, at = _string(data, at + 1)
        type_oid, modifier = _COLUMN.unpack_from(data, at)
        at += 8
        columns.append(Column(column, type_oid, modifier, bool(flags & 1)))
    return Relation(oid, schema, name, identity, tuple(columns))


def decode(data: bytes) -> Message | None:
    """One pgoutput message; ``None`` for the kinds a capture does not use (Origin, Type)."""
    if not data:
        raise DecodeError("empty message")
    kind = data[0]
    if kind == 0x49:  # 'I'
        (oid,) = _U32.unpack_from(data, 1)
        if data[5] != 0x4E:
            raise DecodeError("insert without a new tuple")
        new, _ = _tuple(data, 6)
        return Insert(oid, new)
    if kind == 0x55:  # 'U'
        (oid,) = _U32.unpack_from(data, 1)
        at, old, old_is_key = 5, None, False
        if data[at] in (0x4B, 0x4F):  # 'K' key, 'O' old row
            old_is_key = data[at] == 0x4B
            old, at = _tuple(data, at + 1)
        if data[at] != 0x4E:
            raise DecodeError("update without a new tuple")
        new, _ = _tuple(data, at + 1)
        return Update(oid, old, old_is_key, new)
    if kind == 0x44:  # 'D'
        (oid,) = _U32.unpack_from(data, 1)
        if data[5] not in (0x4B, 0x4F):
            raise DecodeError("delete without an old tuple")
        old, _ = _tuple(data, 6)
        return Delete(oid, old, data[5] == 0x4B)
    if kind == 0x42:  # 'B'
        final_lsn, commit_time, xid = _BEGIN.unpack_from(data, 1)
        return Begin(final_lsn, commit_time + PG_EPOCH_US, xid)
    if kind == 0x43:  # 'C'
        _flags, commit_lsn, end_lsn, commit_time = _COMMIT.unpack_from(data, 1)
        return Commit(commit_lsn, end_lsn, commit_time + PG_EPOCH_US)
    if kind == 0x52:  # 'R'
        return _relation(data)
    if kind == 0x54:  # 'T'
        (count,) = _I32.unpack_from(data, 1)
        options = data[5]
        oids = struct.unpack_from(f"!{count}I", data, 6)
        return Truncate(tuple(oids), bool(options & 1), bool(options & 2))
    if kind == 0x4D:  # 'M'
        flags, lsn = _MESSAGE.unpack_from(data, 1)
        prefix, at = _string(data, 10)
        (size,) = _I32.unpack_from(data, at)
        return LogicalMessage(bool(flags & 1), lsn, prefix, data[at + 4:at + 4 + size])
    if kind in (0x4F, 0x59):  # 'O' origin, 'Y' type
        return None
    raise DecodeError(f"unknown pgoutput message kind {chr(kind)!r}")
