"""A poll's events as one batch: the rows as read, with columns and :class:`Event` objects on demand."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, overload

from ..codec import decode_value
from ..models import Event
from .reader import ROW_FIELDS, Row, events_of

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class EventBatch(Sequence[Event]):
    """The events of one :meth:`Consumer.poll_batch`, kept as the rows the poll read.

    Polling into a batch skips building an :class:`Event` per event (a third of a poll's client time):
    read the columns you need (:attr:`positions`, :attr:`values`, ...) or iterate to get the events one at
    a time. It is a sequence of :class:`Event` (``batch[i]``, ``for event in batch``), commits like a list
    of events (``consumer.commit(batch)``, or ``consumer.commit()`` after the poll), and is empty (false)
    when the poll found nothing. :attr:`rows` holds the rows themselves, fields as :data:`ROW_FIELDS`.
    """

    __slots__ = ("_events", "ends", "rows", "topic")

    def __init__(self, topic: str, rows: list[Row], ends: Mapping[int, int]) -> None:
        #: the topic the events are of
        self.topic = topic
        #: the rows as read (fields as :data:`ROW_FIELDS`; ``payload`` is the stored value, decoded by
        #: :attr:`values`)
        self.rows = rows
        #: per partition, the position of the batch's last event there (what a commit of it stores)
        self.ends: dict[int, int] = dict(ends)
        self._events: list[Event] | None = None

    def __repr__(self) -> str:
        return f"<pgstreams.EventBatch topic={self.topic!r} events={len(self.rows)}>"

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return self.events()[index]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def events(self) -> list[Event]:
        """The batch as :class:`Event` objects (built once, on first use)."""
        if self._events is None:
            self._events = events_of(self.topic, self.rows)
        return self._events

    @property
    def partitions(self) -> list[int]:
        """The partition of each event."""
        return [r[0] for r in self.rows]

    @property
    def positions(self) -> list[int]:
        """The position of each event."""
        return [r[1] for r in self.rows]

    @property
    def keys(self) -> list[str | None]:
        """The key of each event."""
        return [r[5] for r in self.rows]

    @property
    def values(self) -> list[Any]:
        """The value of each event, of the type it was published with (as :attr:`Event.value`)."""
        return [r[6] if r[4] == "b" else decode_value(r[4], r[6]) for r in self.rows]

    @property
    def created_at(self) -> list[datetime]:
        """The creation time of each event (aware, UTC)."""
        return [_EPOCH + r[3] for r in self.rows]


__all__ = ["ROW_FIELDS", "EventBatch"]
