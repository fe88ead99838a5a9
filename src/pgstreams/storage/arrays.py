"""PostgreSQL arrays in binary form, built in one pass: the columns of a multi-row insert
(``insert_many_returning``: ``unnest`` of one array per column).

psycopg dumps a list by looking up a dumper per element in Python, about a microsecond each; a batch of
events of the Kafka gateway has ten columns, most of them all null. :func:`column_arrays` builds each
column's array payload directly (PostgreSQL's binary array format: dimensions, then each element's length
and bytes, -1 for null) and wraps it in a type psycopg sends as it is, with the array type's OID. A column
whose elements need psycopg's own conversion (``jsonb`` values, whose serialisation is configurable) is left
as a list for psycopg.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from psycopg import adapters, pq
from psycopg.adapt import Dumper

_HEADER: Final = struct.Struct(">iiiii")  # dimensions, has nulls, element OID, length, lower bound
_LENGTH: Final = struct.Struct(">i")
_NULL: Final = b"\xff\xff\xff\xff"


class BinaryArray(bytes):
    """An array in PostgreSQL's binary form; subclasses name the array type (:attr:`oid`)."""

    oid: int = 0


class _ArrayDumper(Dumper):
    format = pq.Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def _array_type(name: str, oid: int) -> type[BinaryArray]:
    cls = type(name, (BinaryArray,), {"oid": oid})
    dumper = type(f"{name}Dumper", (_ArrayDumper,), {"oid": oid})
    adapters.register_dumper(cls, dumper)
    return cls


#: Per element type (as the SQL casts name it): the array class and the element's OID and encoder (from the
#: Python value to its binary form; ``None`` for text, encoded with the connection's encoding).
_TYPES: Final[dict[str, tuple[type[BinaryArray], int, Callable[[Any], bytes] | None]]] = {
    "int4": (_array_type("Int4Array", 1007), 23, struct.Struct(">i").pack),
    "int8": (_array_type("Int8Array", 1016), 20, struct.Struct(">q").pack),
    '"char"': (_array_type("CharArray", 1002), 18, None),
    "text": (_array_type("TextArray", 1009), 25, None),
    "bytea": (_array_type("ByteaArray", 1001), 17, bytes),
}


def binary_array(element_type: str, values: Sequence[Any], encoding: str = "utf-8") -> BinaryArray:
    """``values`` (``None`` for null) as a one-dimensional array of ``element_type`` (a key of the supported
    types: ``int4``, ``int8``, ``"char"``, ``text``, ``bytea``), text encoded with ``encoding``."""
    cls, element_oid, encode = _TYPES[element_type]
    n = len(values)
    if values.count(None) == n:  # a column nobody set: the common case of the optional columns
        return cls(_HEADER.pack(1, 1 if n else 0, element_oid, n, 1) + _NULL * n)
    pack = _LENGTH.pack
    fixed = _FIXED.get(element_type)
    if fixed is not None and None not in values:
        data = b"".join([fixed(v) for v in values])
        return cls(_HEADER.pack(1, 0, element_oid, n, 1) + data)
    parts: list[bytes] = []
    append = parts.append
    nulls = 0
    for v in values:
        if v is None:
            append(_NULL)
            nulls = 1
            continue
        data = v.encode(encoding) if encode is None else encode(v)
        append(pack(len(data)))
        append(data)
    return cls(_HEADER.pack(1, nulls, element_oid, n, 1) + b"".join(parts))


#: Element types of a fixed size: the element's length and binary value in one ``pack``.
_INT4_ELEMENT: Final = struct.Struct(">ii").pack
_INT8_ELEMENT: Final = struct.Struct(">iq").pack
_FIXED: Final[dict[str, Callable[[Any], bytes]]] = {
    "int4": lambda v: _INT4_ELEMENT(4, v),
    "int8": lambda v: _INT8_ELEMENT(8, v),
}


def column_arrays(rows: Sequence[Sequence[Any]], columns: Sequence[str], types: Sequence[str],
                  encoding: str = "utf-8") -> dict[str, Any]:
    """The parameters of a multi-row insert of ``rows``: per column (named by ``columns``, typed by
    ``types`` as the statement casts them), its values as a :func:`binary_array`, or as a list for psycopg
    when the type is not one built here (``jsonb``)."""
    out: dict[str, Any] = {}
    for i, (name, element_type) in enumerate(zip(columns, types, strict=True)):
        values = [r[i] for r in rows]
        if element_type in _TYPES:
            out[name] = binary_array(element_type, values, encoding)
        else:
            out[name] = values
    return out
