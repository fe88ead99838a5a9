"""The headers of dead letters: the ``dlt.*`` headers an event's dead-letter copy carries (where it was, why
it failed, after how many attempts, who gave up and when), written by the worker runtime and by share
groups alike, and read by the replay of dead letters."""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from datetime import datetime

from .models import Event

#: The prefix of every header dead-lettering adds (the original headers are kept beside them).
DLT_PREFIX = "dlt."
#: Headers added to an event sent to a dead-letter topic.
DLT_GROUP = "dlt.group"
DLT_TOPIC = "dlt.topic"
DLT_PARTITION = "dlt.partition"
DLT_POSITION = "dlt.position"
DLT_EVENT_ID = "dlt.event_id"
DLT_ERROR_TYPE = "dlt.error_type"
DLT_ERROR_MESSAGE = "dlt.error_message"
DLT_ATTEMPTS = "dlt.attempts"
DLT_MEMBER = "dlt.member"
DLT_FAILED_AT = "dlt.failed_at"
#: Added for events of share groups: how many times the group delivered the event.
DLT_DELIVERIES = "dlt.deliveries"

#: Longest error message kept (dead-letter headers, group status).
MAX_MESSAGE = 2000


def error_text(exc: BaseException) -> tuple[str, str]:
    """The qualified class name of ``exc`` (``ValueError``, ``mymodule.Error``) and its message (at most
    :data:`MAX_MESSAGE` characters)."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    msg = str(exc) or "".join(traceback.format_exception_only(kind, exc)).strip()
    return name, msg[:MAX_MESSAGE]


def dead_letter_headers(event: Event, *, group: str, error: BaseException | None, attempts: int,
                        member_id: str, failed_at: datetime) -> dict[str, str]:
    """The headers of ``event``'s dead-letter copy: its own, plus where it was, why it failed
    (``error``; ``None``: failed under a previous owner, reported as an unknown error) after how many
    ``attempts``, which member gave up and when."""
    kind, msg = error_text(error or RuntimeError("unknown error"))
    headers = dict(event.headers)
    headers.update({
        DLT_GROUP: group, DLT_TOPIC: event.topic, DLT_PARTITION: str(event.partition),
        DLT_POSITION: str(event.position), DLT_ERROR_TYPE: kind, DLT_ERROR_MESSAGE: msg,
        DLT_ATTEMPTS: str(attempts), DLT_MEMBER: member_id, DLT_FAILED_AT: failed_at.isoformat(),
    })
    if event.event_id:
        headers[DLT_EVENT_ID] = event.event_id
    if event.delivery_count:
        headers[DLT_DELIVERIES] = str(event.delivery_count)
    return headers


def share_dead_letter_headers(event: Event, *, group: str, kind: str, message: str, member_id: str,
                              failed_at: datetime) -> dict[str, str]:
    """The headers of the dead-letter copy of an event of share group ``group``: as
    :func:`dead_letter_headers`, with the error given as its type name ``kind`` and ``message`` and the
    delivery count as the attempts (and as ``dlt.deliveries``)."""
    headers = dead_letter_headers(event, group=group, error=None, attempts=event.delivery_count,
                                  member_id=member_id, failed_at=failed_at)
    headers[DLT_ERROR_TYPE] = kind
    headers[DLT_ERROR_MESSAGE] = message
    headers[DLT_DELIVERIES] = str(event.delivery_count)
    return headers


def original_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A dead letter's headers without those dead-lettering added (``dlt.*``)."""
    return {k: v for k, v in headers.items() if not k.startswith(DLT_PREFIX)}
