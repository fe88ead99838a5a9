"""Validation of user-supplied names (topics, groups, schemas), and whether a listening address is a
loopback one (the console and the Kafka gateway refuse others without authentication)."""

from __future__ import annotations

import ipaddress
import re

from .errors import InvalidArgument, InvalidName

#: Highest partition count a topic may have.
MAX_PARTITIONS = 1024
#: Longest topic name, as in Kafka.
MAX_TOPIC_NAME = 249
#: Longest group name.
MAX_GROUP_NAME = 249

_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _check_name(kind: str, name: object, longest: int) -> str:
    if not isinstance(name, str):
        raise InvalidName(f"{kind} name must be a string, not {type(name).__name__}")
    if not _TOPIC_RE.fullmatch(name) or name in (".", "..") or len(name) > longest:
        raise InvalidName(f"invalid {kind} name {name!r}: use 1 to {longest} characters of [A-Za-z0-9._-]")
    return name


def check_topic(name: object) -> str:
    """Return ``name`` if it is a valid topic name, else raise :class:`InvalidName`.

    Topic names follow Kafka: 1 to 249 characters of ``[A-Za-z0-9._-]``, and neither ``.`` nor ``..``.
    """
    return _check_name("topic", name, MAX_TOPIC_NAME)


def check_group(name: object) -> str:
    """Return ``name`` if it is a valid group name (same rules as topic names), else raise."""
    return _check_name("group", name, MAX_GROUP_NAME)


def check_schema(name: object) -> str:
    """Return ``name`` if it is a valid schema name: a letter or ``_`` then up to 62 of ``[A-Za-z0-9_]``."""
    if not isinstance(name, str) or not _SCHEMA_RE.fullmatch(name):
        raise InvalidName(
            f"invalid schema name {name!r}: use a letter or _ followed by up to 62 of [A-Za-z0-9_]"
        )
    return name


def check_partitions(count: object) -> int:
    """Return ``count`` if it is a valid partition count (1 to :data:`MAX_PARTITIONS`)."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidArgument(f"partitions must be an integer, not {type(count).__name__}")
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidArgument(f"partitions must be between 1 and {MAX_PARTITIONS}, got {count}")
    return count


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
