"""The dead letters of a share group: events delivered too often, or rejected, published to the group's
dead-letter topic in one transaction with their removal from the group, and counted in its status."""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg

from ..dltheaders import share_dead_letter_headers
from ..errors import TopicConflict, TopicNotFound
from ..models import Event
from ..ports import Publisher, SessionPort
from ..storage.shares import FINISH_DEAD_LETTER


class ShareDeadLetters:
    """The dead letters of one consumer (``consumer_id``) of share group ``group`` on topic ``topic_id``
    (``partitions`` partitions): copies go to ``topic`` (``None``: dropped, only counted), published by
    ``publisher``, with their partition when the dead-letter topic has as many partitions, else by key."""

    def __init__(self, session: SessionPort, publisher: Publisher, *, group: str, topic_id: int,
                 partitions: int, consumer_id: str, topic: str | None) -> None:
        self._session = session
        self._publisher = publisher
        self._store = session.store.shares
        self.group = group
        self.topic_id = topic_id
        self.partitions = partitions
        self.consumer_id = consumer_id
        self.topic = topic
        self._topic_partitions: int | None = None

    def ensure_topic(self) -> None:
        """Create the dead-letter topic (with the group's topic's partition count) unless it exists."""
        if self.topic is None:
            return
        session = self._session
        try:
            meta = session.topic_state(self.topic)
        except TopicNotFound:
            try:
                self._publisher.create_topic(self.topic, self.partitions)
            except TopicConflict:
                pass
            meta = session.topic_state(self.topic, refresh=True)
        self._topic_partitions = meta.partitions

    def finish(self, events: list[Event], kind: str, message: str, *, too_often: bool
               ) -> set[tuple[int, int]]:
        """Finish the dead-letter claims of ``events``: publish their copies and remove them from the
        group in one transaction; return those this consumer sent (a claim taken over by another consumer
        is theirs)."""
        claims = [(e.partition, e.position, e.delivery_count, None) for e in events]
        by_key = {(e.partition, e.position): e for e in events}
        with self._session.connection() as conn:
            with conn.transaction():
                codes = self._store.settle(conn, self.group, self.topic_id, self.consumer_id,
                                           FINISH_DEAD_LETTER, claims)
                done = [by_key[k] for k, c in codes.items() if c == "k"]
                self.publish(conn, done, kind, message, too_often=too_often)
        return {(e.partition, e.position) for e in done}

    def publish(self, conn: psycopg.Connection, events: list[Event], kind: str, message: str, *,
                too_often: bool = False, rejected: bool = False) -> None:
        """In ``conn``'s transaction: publish the copies of ``events`` (with the reason ``kind`` and
        ``message`` in their headers) and count them in the group's status, as delivered ``too_often``
        or ``rejected``."""
        now = datetime.now(timezone.utc)
        counts: dict[int, int] = {}
        same = self._topic_partitions == self.partitions
        for ev in events:
            counts[ev.partition] = counts.get(ev.partition, 0) + 1
            if self.topic is None:
                continue
            headers = share_dead_letter_headers(ev, group=self.group, kind=kind, message=message,
                                                member_id=self.consumer_id, failed_at=now)
            self._publisher.publish(self.topic, ev.value, key=ev.key, headers=headers,
                                    partition=ev.partition if same else None, event_type=ev.event_type,
                                    correlation_id=ev.correlation_id, causation_id=ev.causation_id, conn=conn)
        sent = self.topic is not None
        for p, n in counts.items():
            self._store.count(conn, self.group, self.topic_id, p, too_often=n if too_often else 0,
                              rejected=n if rejected else 0, dead_lettered=n if sent else 0)
