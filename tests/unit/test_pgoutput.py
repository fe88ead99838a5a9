"""The pgoutput decoder and the values of change data capture, without a server: messages built byte by
byte as protocol 1 writes them, and PostgreSQL's text forms of values to JSON."""

from __future__ import annotations

import struct

import pytest

from pgstreams.cdc.events import UNCHANGED_TOAST, EventMaker, Shape, Source
from pgstreams.cdc.pgoutput import (
    PG_EPOCH_US,
    UNCHANGED,
    Begin,
    Commit,
    DecodeError,
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    Truncate,
    Update,
    decode,
)
from pgstreams.cdc.values import TypeMap, parse_array


def _tuple(*values: object) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            data = str(v).encode()
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


RELATION = (b"R" + struct.pack("!I", 16384) + b"public\0acct\0d" + struct.pack("!h", 2)
            + b"\x01id\0" + struct.pack("!Ii", 23, -1) + b"\x00doc\0" + struct.pack("!Ii", 25, -1))


def test_messages_decode() -> None:
    assert decode(b"B" + struct.pack("!qqI", 0x1_0000_0010, 5, 742)) == Begin(0x1_0000_0010, 5 + PG_EPOCH_US,
                                                                               742)
    assert decode(b"C" + struct.pack("!bqqq", 0, 10, 20, 7)) == Commit(10, 20, 7 + PG_EPOCH_US)
    rel = decode(RELATION)
    assert isinstance(rel, Relation)
    assert (rel.schema, rel.name, rel.replica_identity) == ("public", "acct", "d")
    assert [(c.name, c.type_oid, c.key) for c in rel.columns] == [("id", 23, True), ("doc", 25, False)]
    assert decode(b"I" + struct.pack("!I", 16384) + b"N" + _tuple("1", None)) == Insert(16384, ("1", None))
    assert decode(b"U" + struct.pack("!I", 16384) + b"N" + _tuple("1", UNCHANGED)) == Update(
        16384, None, False, ("1", UNCHANGED))
    assert decode(b"U" + struct.pack("!I", 1) + b"K" + _tuple("1", None) + b"N" + _tuple("2", "x")) == Update(
        1, ("1", None), True, ("2", "x"))
    assert decode(b"D" + struct.pack("!I", 1) + b"O" + _tuple("1", "x")) == Delete(1, ("1", "x"), False)
    assert decode(b"T" + struct.pack("!iB", 2, 3) + struct.pack("!II", 5, 6)) == Truncate((5, 6), True, True)
    assert decode(b"Y" + struct.pack("!I", 1) + b"public\0mood\0") is None
    with pytest.raises(DecodeError, match="unknown pgoutput message kind"):
        decode(b"Z")


def test_a_logical_decoding_message_decodes_with_its_prefix_and_content() -> None:
    content = b'{"mark":"low"}'
    data = b"M" + struct.pack("!bq", 1, 0x2_0000_0040) + b"pgstreams.cdc\0" + struct.pack("!i", len(content))
    assert decode(data + content) == LogicalMessage(True, 0x2_0000_0040, "pgstreams.cdc", content)
    assert decode(b"M" + struct.pack("!bq", 0, 7) + b"p\0" + struct.pack("!i", 0)) == LogicalMessage(
        False, 7, "p", b"")


def test_events_mark_unchanged_toast_and_split_a_key_change() -> None:
    rel = decode(RELATION)
    assert isinstance(rel, Relation)
    shape = Shape.of(rel, "app", TypeMap(), ["id"])
    maker = EventMaker(lambda: 1000)
    source = Source(10, 742, 5)
    (update,) = maker.change(shape, source, Update(rel.oid, None, False, ("1", UNCHANGED)))
    assert update.value["after"] == {"id": 1, "doc": UNCHANGED_TOAST} and update.key == '{"id":1}'
    delete, create = maker.change(shape, source, Update(rel.oid, ("1", None), True, ("2", "x")))
    assert (delete.value["op"], delete.key, delete.value["before"]) == ("d", '{"id":1}', {"id": 1})
    assert (create.value["op"], create.key) == ("c", '{"id":2}')
    assert delete.headers == {"cdc.txId": "742", "cdc.lsn": "0/A"}


@pytest.mark.parametrize(("oid", "text", "expected"), [
    (1184, "2024-05-01 10:00:00.5+00", "2024-05-01T10:00:00.5+00:00"),
    (1184, "2024-05-01 10:00:00+05:30", "2024-05-01T10:00:00+05:30"),
    (1184, "infinity", "infinity"),
    (1114, "2024-05-01 10:00:00", "2024-05-01T10:00:00"),
    (701, "Infinity", "Infinity"), (701, "1e+300", 1e300), (17, "\\x0001ff", "AAH/"),
    (16, "f", False), (20, "-9223372036854775808", -9223372036854775808), (1700, "0.10", "0.10"),
    (3802, '{"a": [1, 2]}', {"a": [1, 2]}), (1007, "[0:1]={1,2}", [1, 2]), (1009, "{}", []),
    (1009, '{"a\\\\b","",NULL,"NULL"}', ["a\\b", "", None, "NULL"]),
])
def test_values_to_json(oid: int, text: str, expected: object) -> None:
    assert TypeMap().converter(oid)(text) == expected


def test_arrays_of_types_looked_up_once() -> None:
    asked: list[list[int]] = []

    def elements(oids: list[int]) -> dict[int, int]:
        asked.append(oids)
        return {90001: 16}  # an array of bool

    types = TypeMap(elements)
    types.learn([90001, 90002, 23])
    types.learn([90001, 90002])
    assert asked == [[90001, 90002]]
    assert types.converter(90001)("{t,f}") == [True, False]
    assert types.converter(90002)("(1,2)") == "(1,2)"  # a type of no other form: its text
    assert parse_array('{{"x y",z},{NULL,w}}', str) == [["x y", "z"], [None, "w"]]
