"""Dead letters: an event whose attempts are spent is published to the dead-letter topic, with headers
saying why, in one transaction with the commit that moves its partition past it (so it is dead-lettered
exactly once)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..errors import TopicConflict, TopicNotFound
from ..models import Event
from .handlers import error_text
from .source import Commit, Source

if TYPE_CHECKING:
    from ..client import Client

#: Headers added to an event sent to a dead-letter topic (the original headers are kept).
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


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class DeadLetters:
    """Sends the events of ``source`` whose attempts are spent to dead-letter topic ``topic``.

    The topic is created on first use with ``partitions`` partitions (those of the source's topic); the
    copy keeps its partition number when the counts match, else its key picks one. ``now`` (default the
    UTC wall clock) stamps ``dlt.failed_at``.
    """

    def __init__(self, client: Client, topic: str, source: Source, *, partitions: int, member_id: str,
                 now: Callable[[], datetime] = _utc_now) -> None:
        self.client = client
        self.topic = topic
        self.source = source
        self.partitions = partitions
        self.member_id = member_id
        self._now = now
        self._dlt_partitions: int | None = None

    def _topic_partitions(self) -> int:
        if self._dlt_partitions is None:
            try:
                meta = self.client.topic_state(self.topic)
            except TopicNotFound:
                try:
                    self.client.create_topic(self.topic, self.partitions)
                except TopicConflict:
                    pass
                meta = self.client.topic_state(self.topic, refresh=True)
            self._dlt_partitions = meta.partitions
        return self._dlt_partitions

    def send(self, event: Event, *, attempts: int, error: BaseException | None) -> Commit:
        """Publish ``event``'s dead-letter copy and commit ``event`` in one transaction; nothing is kept
        unless the commit is accepted (see :attr:`Commit.ok`)."""
        headers = dead_letter_headers(event, group=self.source.group, error=error, attempts=attempts,
                                      member_id=self.member_id, failed_at=self._now())
        partition = event.partition if self._topic_partitions() == self.partitions else None
        with self.source.transaction() as tx:
            self.client.publish(self.topic, event.value, key=event.key, headers=headers, partition=partition,
                                event_type=event.event_type, correlation_id=event.correlation_id,
                                causation_id=event.causation_id, conn=tx.connection)
            return self.source.commit([event], tx)
