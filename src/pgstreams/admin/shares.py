"""Share groups and queues of :class:`pgstreams.Client`: share consumers, queues (a topic with a share group
of the same name) and the share groups' status (the :class:`ShareAdmin` methods of the client)."""

from __future__ import annotations

from ..consumer.reader import Start
from ..errors import GroupNotFound, PermissionDenied
from ..models import DEFAULT_SEGMENT_SIZE, ShareGroupStatus, TopicInfo
from ..names import check_group, check_topic
from ..ports import HasSession, SessionPublisher
from ..shares import SHARE_DEFAULTS, Ordering, ShareConsumer, ShareOptions


class ShareAdmin:
    """The share groups and queues of :class:`pgstreams.Client` (a mixin: the client publishes the dead
    letters of its share consumers)."""

    def share_consumer(
        self: SessionPublisher, topic: str, group: str, *, start: Start = SHARE_DEFAULTS.start,
        lock_timeout: float = SHARE_DEFAULTS.lock_timeout,
        max_deliveries: int = SHARE_DEFAULTS.max_deliveries,
        dead_letter: bool | str = SHARE_DEFAULTS.dead_letter,
        ordering: Ordering = SHARE_DEFAULTS.ordering,
    ) -> ShareConsumer:
        """A :class:`pgstreams.ShareConsumer` of ``topic`` in share group ``group``: any number of them,
        in any processes, share every partition of the topic, each event going to one of them at a time.

        ``start`` (default ``"earliest"``) is where a group new on a partition starts: ``"earliest"``,
        ``"latest"`` or an aware ``datetime`` (like stream groups). ``lock_timeout`` (default 30 s): how
        long an acquired event stays locked. ``max_deliveries`` (default 5): after that many deliveries
        an event goes to the dead-letter topic instead of being delivered again. ``dead_letter`` (default
        ``True``: ``"<topic>.dlt"``, created with the topic's partition count on first use; a topic name;
        ``False``: none, such events are dropped). ``ordering`` (default ``None``: no order; ``"key"``:
        events with the same key are never in flight at once and are delivered in partition order).
        Raises :class:`TopicNotFound` and :class:`InvalidArgument` (nothing is changed then).
        """
        return ShareConsumer(self, topic, group, ShareOptions(
            start=start, lock_timeout=lock_timeout, max_deliveries=max_deliveries, dead_letter=dead_letter,
            ordering=ordering))

    def create_queue(
        self: SessionPublisher, name: str, partitions: int = 1, *,
        lock_timeout: float = SHARE_DEFAULTS.lock_timeout,
        max_deliveries: int = SHARE_DEFAULTS.max_deliveries,
        dead_letter: bool | str = SHARE_DEFAULTS.dead_letter,
        ordering: Ordering = SHARE_DEFAULTS.ordering, segment_size: int = DEFAULT_SEGMENT_SIZE,
    ) -> TopicInfo:
        """Create queue ``name``: a topic (``partitions``, default 1; ``segment_size`` as for
        :meth:`create_topic`) with a share group of the same name starting at its beginning, with these
        settings (defaults as for :meth:`share_consumer`). Idempotent; :meth:`queue` returns its
        consumer. Acked events stay in the topic's segments (the log) until retention removes them."""
        options = ShareOptions(lock_timeout=lock_timeout, max_deliveries=max_deliveries,
                               dead_letter=dead_letter, ordering=ordering)
        ShareConsumer.check(name, name, options)
        info = self.create_topic(name, partitions, segment_size=segment_size)
        ShareConsumer(self, name, name, options, queue=True)
        return info

    def queue(self: SessionPublisher, name: str) -> ShareConsumer:
        """The :class:`pgstreams.ShareConsumer` of queue ``name`` (with the settings it was created with).
        Raises :class:`TopicNotFound`, :class:`GroupNotFound` when ``name`` is a topic but no queue, and
        :class:`PermissionDenied` for a role without a consume grant of group ``name`` on it."""
        session = self.session
        state = session.topic_state(name, refresh=True)  # checks the name
        shares = session.store.shares
        settings = shares.settings(name, state.id)
        if settings is None and not shares.may_use(name, state.id):
            raise PermissionDenied(f"permission denied to use queue {name!r} (see pgstreams grant --consume)")
        if settings is None or not settings.queue:
            raise GroupNotFound(f"{name!r} is a topic, not a queue (create it with create_queue)")
        ordering: Ordering = "key" if settings.ordering == "key" else None
        return ShareConsumer(self, name, name, ShareOptions(
            lock_timeout=settings.lock_timeout, max_deliveries=settings.max_deliveries,
            dead_letter=settings.dead_letter if settings.dead_letter is not None else False,
            ordering=ordering), queue=True)

    def describe_share_group(self: HasSession, group: str, topic: str | None = None
                             ) -> list[ShareGroupStatus]:
        """Per topic and partition of share group ``group`` (of ``topic`` only, if given): where it
        started, acquired, available, waiting and delivered-too-often counts, the oldest lock and the
        dead-letter counters (the ``share_group_status`` view). Raises ``GroupNotFound``."""
        check_group(group)
        if topic is not None:
            check_topic(topic)
        out = self.session.store.shares.status(group, topic)
        if not out:
            where = f" on topic {topic!r}" if topic else ""
            raise GroupNotFound(f"share group {group!r} does not exist{where}")
        return out
