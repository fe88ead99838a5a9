"""Dead letters: an event whose attempts are spent is published to the dead-letter topic, with headers
saying why, in one transaction with the commit that moves its partition past it (so it is dead-lettered
exactly once)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from ..dltheaders import (
    DLT_ATTEMPTS,
    DLT_DELIVERIES,
    DLT_ERROR_MESSAGE,
    DLT_ERROR_TYPE,
    DLT_EVENT_ID,
    DLT_FAILED_AT,
    DLT_GROUP,
    DLT_MEMBER,
    DLT_PARTITION,
    DLT_POSITION,
    DLT_TOPIC,
    dead_letter_headers,
)
from ..errors import TopicConflict, TopicNotFound
from ..models import Event
from ..ports import SessionPublisher
from .source import Commit, Source

__all__ = ["DLT_ATTEMPTS", "DLT_DELIVERIES", "DLT_ERROR_MESSAGE", "DLT_ERROR_TYPE", "DLT_EVENT_ID",
           "DLT_FAILED_AT", "DLT_GROUP", "DLT_MEMBER", "DLT_PARTITION", "DLT_POSITION", "DLT_TOPIC",
           "DeadLetters", "dead_letter_headers"]


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class DeadLetters:
    """Sends the events of ``source`` whose attempts are spent to dead-letter topic ``topic``.

    The topic is created on first use with ``partitions`` partitions (those of the source's topic); the
    copy keeps its partition number when the counts match, else its key picks one. ``client`` (a
    :class:`pgstreams.Client`) publishes the copies. ``now`` (default the UTC wall clock) stamps
    ``dlt.failed_at``.
    """

    def __init__(self, client: SessionPublisher, topic: str, source: Source, *, partitions: int,
                 member_id: str, now: Callable[[], datetime] = _utc_now) -> None:
        self.client = client
        self._session = client.session
        self.topic = topic
        self.source = source
        self.partitions = partitions
        self.member_id = member_id
        self._now = now
        self._dlt_partitions: int | None = None

    def _topic_partitions(self) -> int:
        if self._dlt_partitions is None:
            try:
                meta = self._session.topic_state(self.topic)
            except TopicNotFound:
                try:
                    self.client.create_topic(self.topic, self.partitions)
                except TopicConflict:
                    pass
                meta = self._session.topic_state(self.topic, refresh=True)
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
