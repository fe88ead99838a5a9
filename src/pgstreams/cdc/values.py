"""Column values to JSON, by type: what the text format of PostgreSQL (as a capturer's connection writes
it: :data:`pgstreams.storage.cdc.DECODING_SETTINGS`) becomes in an event.

- integers (``int2``, ``int4``, ``int8``, ``oid``, ``xid``) and ``bool``: JSON numbers and booleans;
- ``float4``/``float8``: JSON numbers, except ``NaN`` and the infinities, which JSON has not: strings;
- ``numeric`` and ``money``: strings (exact: a JSON number would lose digits in most readers);
- ``bytea``: base64 strings;
- ``timestamptz``: ISO 8601 with the zone (``2024-05-01T12:00:00.5+00:00``), ``timestamp`` ISO 8601
  without one (it has none); ``date``, ``time``, ``timetz``, ``interval`` as PostgreSQL writes them
  (ISO); ``infinity`` and BC dates stay PostgreSQL's text;
- ``json``/``jsonb``: the JSON value itself;
- arrays of any of these: JSON arrays (nested for multidimensional ones) of the elements' forms;
- every other type (text, uuid, enums, network addresses, geometry, ranges, ...): its text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any, Final

Converter = Callable[[str], Any]


def _bool(text: str) -> bool:
    return text == "t"


def _float(text: str) -> float | str:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        return text
    return value


def _bytea(text: str) -> str:
    if text.startswith("\\x"):
        return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")
    return base64.b64encode(text.encode("utf-8")).decode("ascii")  # pragma: no cover - escape format


def _timestamp(text: str) -> str:
    if text.endswith(" BC") or not text[:1].isdigit():  # infinity, -infinity, BC
        return text
    return text.replace(" ", "T", 1)


def _timestamptz(text: str) -> str:
    if text.endswith(" BC") or not text[:1].isdigit():
        return text
    out = text.replace(" ", "T", 1)
    sign = max(out.rfind("+"), out.rfind("-"))
    zone = out[sign + 1:]
    if sign > 10 and ":" not in zone:  # +00 -> +00:00
        out = f"{out}:00"
    return out


#: The converter of each built-in scalar type (by oid) whose JSON form is not its text.
SCALARS: Final[dict[int, Converter]] = {
    16: _bool, 17: _bytea, 20: int, 21: int, 23: int, 26: int, 28: int,
    700: _float, 701: _float, 114: json.loads, 3802: json.loads,
    1114: _timestamp, 1184: _timestamptz,
}

#: The element type of each built-in array type (by oid).
ARRAYS: Final[dict[int, int]] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1005: 21, 1007: 23, 1016: 20, 1028: 26, 1011: 28,
    1009: 25, 1014: 1042, 1015: 1043, 1021: 700, 1022: 701, 1231: 1700, 791: 790, 1182: 1082,
    1183: 1083, 1270: 1266, 1115: 1114, 1185: 1184, 1187: 1186, 2951: 2950, 199: 114, 3807: 3802,
    1040: 829, 1041: 869, 651: 650,
}


def _text(text: str) -> str:
    return text


def parse_array(text: str, element: Converter) -> list[Any]:
    """PostgreSQL's text form of an array (``{1,2,NULL}``, ``{{"a b",c},{d,e}}``, ``[0:1]={1,2}``) as a
    list (nested for each dimension), each element through ``element`` (``NULL``: ``None``)."""
    if text.startswith("["):  # explicit bounds: [lo:hi]={...}
        text = text[text.index("=") + 1:]
    stack: list[list[Any]] = []
    out: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            new: list[Any] = []
            if stack:
                stack[-1].append(new)
            else:
                out = new
            stack.append(new)
            i += 1
        elif c == "}":
            stack.pop()
            i += 1
        elif c == ",":
            i += 1
        elif c == '"':
            j, chars = i + 1, []
            while text[j] != '"':
                if text[j] == "\\":
                    j += 1
                chars.append(text[j])
                j += 1
            stack[-1].append(element("".join(chars)))
            i = j + 1
        else:
            j = i
            while text[j] not in ",}":
                j += 1
            word = text[i:j]
            stack[-1].append(None if word == "NULL" else element(word))
            i = j
    return out


class TypeMap:
    """The converter of each type oid; array types other than the built-in ones are looked up once with
    ``elements`` (oids -> element oid of those that are arrays)."""

    def __init__(self, elements: Callable[[list[int]], dict[int, int]] | None = None) -> None:
        self._elements = elements
        self._converters: dict[int, Converter] = dict(SCALARS)
        self._known: set[int] = set()

    def learn(self, oids: Iterable[int]) -> None:
        """Look up the oids not known yet (one query for all of them)."""
        new = [o for o in oids if o not in self._converters and o not in self._known and o not in ARRAYS]
        if not new:
            return
        found = self._elements(new) if self._elements is not None else {}
        for oid in new:
            self._known.add(oid)
            if oid in found:
                element = self.converter(found[oid])
                self._converters[oid] = lambda text, e=element: parse_array(text, e)  # type: ignore[misc]

    def converter(self, oid: int) -> Converter:
        """The converter of type ``oid`` (its text as it is for types of no other form)."""
        conv = self._converters.get(oid)
        if conv is not None:
            return conv
        if oid in ARRAYS:
            element = self.converter(ARRAYS[oid])
            conv = self._converters[oid] = lambda text: parse_array(text, element)
            return conv
        return _text
