"""Subscriptions: what a worker runs (a handler on a topic for a group) and the options of how."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..consumer import Start, check_start
from ..errors import InvalidArgument
from ..groups import check_timing, get_group_config
from ..names import check_group, check_topic
from ..shares.options import check_lock_timeout
from .batching import BatchConfig
from .handlers import Handler, as_called, check_handler
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ..ports import HasSession

#: Processing modes: ``"at-least-once"`` (commit after the handler) or ``"transactional"``.
Mode = Literal["at-least-once", "transactional"]
MODES: tuple[str, ...] = ("at-least-once", "transactional")


@dataclass(frozen=True)
class SubscriptionOptions:
    """How a subscription runs its handler: the keyword arguments of :meth:`pgstreams.Worker.subscribe`
    (and, but ``start``, the membership timings and ``partitions``, of :func:`run_consumer`),
    with the same defaults. Checked when the subscription is made, not here.

    ``batch`` (default false): call the handler with a list of events. ``min_events`` / ``max_events`` /
    ``max_wait``: see :class:`BatchConfig` (its defaults, 1, 100, 1.0 s). ``mode`` (default
    ``"at-least-once"``) or ``"transactional"``. ``retry`` (default ``None``: ``RetryPolicy()``).
    ``dead_letter`` (default ``None``: the group's configuration; ``True``: ``"<topic>.dlt"``; a topic
    name; ``False``: none). ``start`` (default ``"earliest"``): where the group starts on partitions
    without a checkpoint. ``heartbeat_interval`` / ``session_timeout`` (default ``None``: the group's
    configuration). ``partitions`` (default ``None``: join the group's membership): a static assignment.
    ``share`` (default false): ``group`` is a share group (every process reads every partition, events are
    acquired one by one); ``concurrency`` (default 1, share groups only): handlers run at once in this
    process; ``lock_timeout`` (default ``None``: :data:`pgstreams.DEFAULT_LOCK_TIMEOUT`, share groups
    only): seconds each acquired event stays locked to this worker (0.01 to 86400).
    """

    batch: bool = False
    min_events: int = BatchConfig.min_events
    max_events: int = BatchConfig.max_events
    max_wait: float = BatchConfig.max_wait
    mode: Mode = "at-least-once"
    retry: RetryPolicy | None = None
    dead_letter: str | bool | None = None
    start: Start = "earliest"
    heartbeat_interval: float | None = None
    session_timeout: float | None = None
    partitions: Sequence[int] | None = None
    share: bool = False
    concurrency: int = 1
    lock_timeout: float | None = None


#: Most handlers a share subscription runs at once in one process.
MAX_CONCURRENCY = 256


@dataclass(frozen=True)
class Subscription:
    """What a worker runs: ``handler`` on ``topic`` for ``group`` (see :meth:`Worker.subscribe`)."""

    topic: str
    group: str
    handler: Handler
    batch: bool
    config: BatchConfig
    mode: str
    retry: RetryPolicy
    dead_letter: str | None
    start: Start
    heartbeat_interval: float | None = None
    session_timeout: float | None = None
    share: bool = False
    concurrency: int = 1
    lock_timeout: float | None = None


def dead_letter_topic(client: HasSession, group: str, topic: str, dead_letter: object) -> str | None:
    """The dead-letter topic of ``topic`` for ``group`` as the ``dead_letter`` option says (``None``: the
    group's configuration); ``None`` for none."""
    if dead_letter is None:
        name = get_group_config(client, group).dead_letter_for(topic)
    elif dead_letter is True:
        name = f"{topic}.dlt"
    elif dead_letter is False:
        name = None
    elif isinstance(dead_letter, str):
        name = dead_letter
    else:
        raise InvalidArgument(f"dead_letter must be a topic name, True, False or None, not {dead_letter!r}")
    if name is not None:
        check_topic(name)
        if name == topic:
            raise InvalidArgument(f"the dead-letter topic of {topic!r} cannot be the topic itself")
    return name


def make_subscription(client: HasSession, topic: str, group: str, handler: object,
                      options: SubscriptionOptions) -> Subscription:
    """Check ``handler`` and ``options`` for ``topic`` and ``group`` (:class:`InvalidArgument`,
    :class:`pgstreams.TopicNotFound`) and resolve their defaults. Membership timings are checked
    against the group's configuration unless ``options.partitions`` makes the assignment static."""
    o = options
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, not {type(handler).__name__}")
    if not isinstance(o.batch, bool):
        raise InvalidArgument(f"batch must be true or false, not {o.batch!r}")
    if o.mode not in MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {o.mode!r}")
    check_handler(handler, o.batch, o.mode)
    retry = o.retry
    if retry is None:
        retry = RetryPolicy()
    elif not isinstance(retry, RetryPolicy):
        raise InvalidArgument(f"retry must be a RetryPolicy, not {type(retry).__name__}")
    config = BatchConfig(o.min_events, o.max_events, o.max_wait)
    if not isinstance(o.share, bool):
        raise InvalidArgument(f"share must be true or false, not {o.share!r}")
    if (isinstance(o.concurrency, bool) or not isinstance(o.concurrency, int)
            or not 1 <= o.concurrency <= MAX_CONCURRENCY):
        raise InvalidArgument(
            f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}, got {o.concurrency!r}")
    if o.concurrency != 1 and not o.share:
        raise InvalidArgument("concurrency needs share=True (a stream group processes a partition in order, "
                              "with one handler at a time)")
    lock_timeout = None
    if o.lock_timeout is not None:
        if not o.share:
            raise InvalidArgument("lock_timeout needs share=True (a stream group's partitions are held by "
                                  "leases, whose session_timeout plays that part)")
        lock_timeout = check_lock_timeout(o.lock_timeout)
    if o.share and o.partitions is not None:
        raise InvalidArgument("partitions cannot be given with share=True (every consumer of a share group "
                              "reads every partition)")
    name = client.session.topic_state(topic).name
    check_group(group)
    if o.partitions is None and (o.heartbeat_interval is not None or o.session_timeout is not None):
        cfg = get_group_config(client, group)  # the timings as the member will use them, checked now
        check_timing(cfg.heartbeat_interval if o.heartbeat_interval is None else o.heartbeat_interval,
                     cfg.session_timeout if o.session_timeout is None else o.session_timeout)
    return Subscription(name, group, as_called(handler), o.batch, config, o.mode, retry,
                        dead_letter_topic(client, group, name, o.dead_letter), check_start(o.start),
                        o.heartbeat_interval, o.session_timeout, o.share, o.concurrency, lock_timeout)


#: Every subscription option at its default: the one place the keyword defaults of
#: :meth:`pgstreams.Worker.subscribe` and :func:`run_consumer` come from.
DEFAULTS = SubscriptionOptions()
