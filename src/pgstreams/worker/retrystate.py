"""Retry states in the group status (kept by the storage layer in table ``leases``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from ..dltheaders import MAX_MESSAGE
from .retry import RetryState

if TYPE_CHECKING:
    from ..ports import SessionPort


class RetryStateStore:
    """The retry state of a group member's partitions, as ``consumer_group_status`` shows it.

    :meth:`take_over` reads the attempts recorded under a previous owner, :meth:`record` sets a failing
    event's state, :meth:`committed` clears it once the partition moved on. It remembers the partitions
    whose state may be set, so committing on the others costs no statement.
    """

    def __init__(self, session: SessionPort, group: str, topic_id: int, member_id: str) -> None:
        self._groups = session.store.groups
        self._group = group
        self._topic_id = topic_id
        self._member_id = member_id
        self._flagged: set[int] = set()

    def take_over(self, partitions: Collection[int]) -> list[tuple[int, int, int]]:
        """The failing event each of ``partitions`` was stuck on under its previous owner, as
        ``(partition, position, attempts)``."""
        self._flagged |= set(partitions)
        if not partitions:
            return []
        found = self._groups.retry_attempts(self._group, self._topic_id, sorted(partitions))
        return [(p, position, attempts) for (p, position), attempts in found.items()]

    def record(self, partition: int, position: int, attempts: int, error: str, state: RetryState) -> None:
        """The event at ``position`` failed ``attempts`` times (the last with ``error``)."""
        self._flagged.add(partition)
        self._groups.set_retry_state(self._group, self._topic_id, partition, self._member_id, state, position,
                                     attempts, error[:MAX_MESSAGE])

    def committed(self, partitions: Collection[int]) -> None:
        """Events of ``partitions`` were committed: their retry state is over."""
        done = set(partitions) & self._flagged
        if done:
            self._groups.clear_retry_state(self._group, self._topic_id, sorted(done))
        self._flagged -= done
