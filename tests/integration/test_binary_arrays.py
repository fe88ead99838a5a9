"""The binary arrays of multi-row inserts (pgstreams.storage.arrays) read back on a real server as the same
values, nulls, non-ASCII text and empty arrays included, and an insert of them stores what psycopg's own
dumping of the same lists stores."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgstreams.storage.arrays import binary_array, column_arrays

CASES: list[tuple[str, list[Any]]] = [
    ("int4", [0, 1, -1, 2**31 - 1, -(2**31), None]),
    ("int8", [0, 2**63 - 1, -(2**63), None, 42]),
    ('"char"', ["e", "t", None]),
    ("text", ["a", "", "ünïcødé ✓", None, "x" * 10_000]),
    ("bytea", [b"", b"\x00\xff", None, bytes(range(256)) * 40]),
    ("text", []),
    ("bytea", [None, None]),
]


@pytest.mark.parametrize(("element_type", "values"), CASES)
def test_a_binary_array_reads_back_as_its_values(dsn: str, element_type: str, values: list[Any]) -> None:
    with psycopg.connect(dsn) as conn:
        got = conn.execute(f"SELECT %b::{element_type}[]", (binary_array(element_type, values),)).fetchone()
    assert got is not None
    expected = [None if v is None else (bytes(v) if isinstance(v, bytes) else v) for v in values]
    assert got[0] == expected


def test_column_arrays_insert_what_psycopgs_lists_insert(dsn: str) -> None:
    columns = ("p", "k", "key", "value", "headers", "producer")
    types = ("int4", '"char"', "text", "bytea", "jsonb", "int8")
    rows = [(0, "e", "k1", b"v1", None, 7), (3, "e", None, b"", Jsonb({"h": "ä"}), None),
            (1, "t", "ключ", b"\x00" * 3, None, -5)]
    insert = ('INSERT INTO t SELECT * FROM unnest(%(p)b::int[], %(k)b::"char"[], %(key)b::text[], '
              '%(value)b::bytea[], %(headers)b::jsonb[], %(producer)b::bigint[])')
    with psycopg.connect(dsn) as conn:
        conn.execute('CREATE TABLE t (p int, k "char", key text, value bytea, headers jsonb, '
                     'producer bigint)')
        conn.execute(insert, column_arrays(rows, columns, types, conn.info.encoding))
        mine = conn.execute("SELECT * FROM t ORDER BY p").fetchall()
        conn.execute("TRUNCATE t")
        conn.execute(insert, {name: [r[i] for r in rows] for i, name in enumerate(columns)})
        theirs = conn.execute("SELECT * FROM t ORDER BY p").fetchall()
    assert mine == theirs and len(mine) == 3
    assert mine[2][2] is None and mine[2][4] == {"h": "ä"} and mine[1][2] == "ключ"  # by p: 0, 1, 3
