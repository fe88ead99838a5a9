"""Group configuration shared by a group's members: heartbeat timings and the dead-letter topic."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..errors import InvalidArgument
from ..names import check_group, check_topic

if TYPE_CHECKING:
    from ..ports import HasSession

#: Default seconds between two heartbeats of a member (and between two balancing runs).
DEFAULT_HEARTBEAT_INTERVAL = 3.0
#: Default seconds without a heartbeat after which a member is stale and loses its leases.
DEFAULT_SESSION_TIMEOUT = 30.0
#: The suffix of a topic's default dead-letter topic (``<topic>.dlt``).
DEAD_LETTER_SUFFIX = ".dlt"


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")
    if value < 0.01 or value > 86400:
        raise InvalidArgument(f"{name} must be between 0.01 and 86400 seconds, got {value!r}")
    return float(value)


def check_timing(heartbeat_interval: object, session_timeout: object) -> tuple[float, float]:
    """Validate a heartbeat interval and session timeout (seconds); the timeout must be at least twice
    the interval, so a member heartbeats at least once before it stops trusting its leases."""
    hb = _seconds("heartbeat_interval", heartbeat_interval)
    st = _seconds("session_timeout", session_timeout)
    if st < 2 * hb:
        raise InvalidArgument(
            f"session_timeout ({st:g} s) must be at least twice heartbeat_interval ({hb:g} s)")
    return hb, st


def default_dead_letter_topic(topic: str) -> str:
    """The dead-letter topic of ``topic`` unless configured otherwise: ``"<topic>.dlt"``."""
    return f"{topic}{DEAD_LETTER_SUFFIX}"


@dataclass(frozen=True)
class GroupConfig:
    """Settings of a group shared by its members (table ``group_config``).

    ``heartbeat_interval`` (default :data:`DEFAULT_HEARTBEAT_INTERVAL`, 3 s) and ``session_timeout``
    (default :data:`DEFAULT_SESSION_TIMEOUT`, 30 s) apply to members that do not set their own.
    ``dead_letter`` (default true) says whether events whose retries are spent go to a dead-letter topic:
    ``dead_letter_topic``, or ``"<topic>.dlt"`` when that is ``None`` (the default). With
    ``dead_letter=False`` the group retries a failing event forever.
    """

    group: str
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    dead_letter: bool = True
    dead_letter_topic: str | None = None
    updated_at: datetime | None = None

    def dead_letter_for(self, topic: str) -> str | None:
        """The dead-letter topic of ``topic`` for this group, ``None`` when disabled."""
        if not self.dead_letter:
            return None
        return self.dead_letter_topic or default_dead_letter_topic(topic)


def get_group_config(client: HasSession, group: str) -> GroupConfig:
    """The configuration of ``group`` (the defaults when it was never configured). ``client``: a
    :class:`pgstreams.Client` or a session."""
    check_group(group)
    row = client.session.store.groups.config(group)
    if row is None:
        return GroupConfig(group)
    hb_ms, st_ms = row["heartbeat_interval_ms"], row["session_timeout_ms"]
    updated = row["updated_at"]
    return GroupConfig(
        group,
        hb_ms / 1000 if hb_ms is not None else DEFAULT_HEARTBEAT_INTERVAL,
        st_ms / 1000 if st_ms is not None else DEFAULT_SESSION_TIMEOUT,
        bool(row["dead_letter"]), row["dead_letter_topic"],
        None if updated is None else updated.astimezone(timezone.utc),
    )


def configure_group(client: HasSession, group: str, *, heartbeat_interval: float | None = None,
                    session_timeout: float | None = None,
                    dead_letter: str | bool | None = None) -> GroupConfig:
    """Change the configuration of ``group``; arguments left ``None`` keep their current value.

    ``dead_letter``: ``True`` for the default dead-letter topic ``"<topic>.dlt"``, a topic name for that
    topic, ``False`` for none (failing events are retried forever). Members read the configuration when
    they start. Returns the new configuration.
    """
    check_group(group)
    cur = get_group_config(client, group)
    hb = cur.heartbeat_interval if heartbeat_interval is None else heartbeat_interval
    st = cur.session_timeout if session_timeout is None else session_timeout
    hb, st = check_timing(hb, st)
    dl, dlt = cur.dead_letter, cur.dead_letter_topic
    if dead_letter is True:
        dl, dlt = True, None
    elif dead_letter is False:
        dl, dlt = False, None
    elif isinstance(dead_letter, str):
        dl, dlt = True, check_topic(dead_letter)
    elif dead_letter is not None:
        raise InvalidArgument(f"dead_letter must be a topic name, True or False, not {dead_letter!r}")
    client.session.store.groups.put_config(group, hb, st, dl, dlt)
    return get_group_config(client, group)
