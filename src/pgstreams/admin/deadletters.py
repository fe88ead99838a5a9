"""Replaying dead letters: publishing the dead letters of a dead-letter topic back to the topic each came
from, each once (behind :meth:`pgstreams.Client.replay_dead_letters`,
:meth:`~pgstreams.Client.replay_dead_letter`, the :class:`DeadLetterAdmin` methods of the client, and the
``pgstreams dlt replay`` command)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from ..consumer import Consumer, StreamReader
from ..dltheaders import DLT_ERROR_TYPE, DLT_TOPIC, original_headers
from ..errors import GroupActive, InvalidArgument
from ..models import Event, PublishResult, ReplayResult
from ..names import check_group, check_topic
from ..ports import SessionPublisher
from .topics import read_events

log = logging.getLogger("pgstreams.admin")

#: The header a replayed dead letter carries: ``<dead-letter topic>/<partition>/<position>`` it came from.
REPLAYED_FROM = "dlt.replayed_from"
#: The header a replayed dead letter carries: when it was replayed (ISO 8601, UTC).
REPLAYED_AT = "dlt.replayed_at"
#: The group that records a replay's progress on a dead-letter topic unless ``group`` is given.
DEFAULT_REPLAY_GROUP = "pgstreams-dlt-replay"
#: Dead letters read per transaction of a replay.
REPLAY_BATCH = 500


def replay_dead_letters(
    client: SessionPublisher,
    dlt_topic: str,
    *,
    to: str | None = None,
    group: str | None = None,
    where_error_type: str | None = None,
    dry_run: bool = False,
    max_events: int | None = None,
) -> ReplayResult:
    """Publish the dead letters of ``dlt_topic`` back to the topic each came from (its ``dlt.topic``
    header), or to ``to``, with the original key, value, headers (without the ``dlt.*`` ones), event type
    and correlation and causation ids, adding the header :data:`REPLAYED_FROM`.

    Progress is the checkpoint of stream group ``group`` (default :data:`DEFAULT_REPLAY_GROUP`) on the
    dead-letter topic, stored in the same transaction as the events it replayed, and each copy has the
    event id ``replay:<dlt topic>/<partition>/<position>``: each dead letter is replayed once, even if a
    replay is interrupted and run again. Dead letters whose ``dlt.error_type`` is not ``where_error_type``
    (default: no filter) are passed over (the group moves past them: use another group to replay them
    later). ``dry_run`` (default false) publishes nothing and moves nothing, and returns the events that
    would be replayed. ``max_events`` (default: all) bounds the number read. Stops once it has read up to
    the end of the dead-letter topic as it stood when the replay started. ``client``: a client (it
    publishes the copies).
    """
    session = client.session
    check_topic(dlt_topic)
    if to is not None:
        session.topic_state(to, refresh=True)  # checks the name
    group = check_group(group if group is not None else DEFAULT_REPLAY_GROUP)
    if where_error_type is not None and not isinstance(where_error_type, str):
        raise InvalidArgument(f"where_error_type must be a string, got {where_error_type!r}")
    if max_events is not None and (
        isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1
    ):
        raise InvalidArgument(f"max_events must be a positive integer, got {max_events!r}")
    read = replayed = skipped = 0
    would: list[Event] = []
    now = datetime.now(timezone.utc).isoformat()

    def wanted(ev: Event) -> str | None:
        """The topic to replay ``ev`` to, ``None`` when it is passed over."""
        if where_error_type is not None and ev.headers.get(DLT_ERROR_TYPE) != where_error_type:
            return None
        target = to or ev.headers.get(DLT_TOPIC)
        if not target:
            log.warning(
                "dead letter %s/%s/%s has no dlt.topic header and no target: passed over",
                dlt_topic,
                ev.partition,
                ev.position,
            )
        return target

    def room() -> int:
        return REPLAY_BATCH if max_events is None else min(REPLAY_BATCH, max_events - read)

    if dry_run:  # read from the group's checkpoints (earliest where it has none) and store nothing
        reader = StreamReader(session, dlt_topic, group)
        reader.record_losses = False
        with session.connection() as conn:
            reader.load(conn)
            reader.restore({p: reader.positions().get(p, 0) for p in reader.partitions})
            while room() > 0:
                events = reader.fetch(conn, room())
                if not events:
                    break
                for ev in events:
                    read += 1
                    if wanted(ev) is None:
                        skipped += 1
                    else:
                        replayed += 1
                        would.append(ev)
        return ReplayResult(read, replayed, skipped, True, tuple(would))

    consumer = Consumer(session, dlt_topic, group)
    while room() > 0:
        with consumer.transaction() as tx:
            events = tx.poll(room(), timeout=0)
            for ev in events:
                read += 1
                target = wanted(ev)
                if target is None:
                    skipped += 1
                    continue
                replayed += 1
                headers = original_headers(ev.headers)
                headers[REPLAYED_FROM] = f"{dlt_topic}/{ev.partition}/{ev.position}"
                headers[REPLAYED_AT] = now
                client.publish(
                    target,
                    ev.value,
                    key=ev.key,
                    headers=headers,
                    event_type=ev.event_type,
                    event_id=f"replay:{dlt_topic}/{ev.partition}/{ev.position}",
                    correlation_id=ev.correlation_id,
                    causation_id=ev.causation_id,
                    conn=tx.connection,
                )
        if not events:
            break
        if tx.outcome is not None and not tx.outcome.ok:
            raise GroupActive(
                f"group {group!r} on {dlt_topic!r} was moved by another process during the "
                f"replay ({tx.outcome.name}): nothing of this batch was kept"
            )
    return ReplayResult(read, replayed, skipped, False, ())


def replay_dead_letter(client: SessionPublisher, dlt_topic: str, partition: int, position: int, *,
                       to: str | None = None) -> PublishResult:
    """Replay the dead letter at ``partition`` / ``position`` of ``dlt_topic`` (see
    :meth:`pgstreams.Client.replay_dead_letter`; ``client``: a client, which publishes the copy)."""
    check_topic(dlt_topic)
    if to is not None:
        check_topic(to)
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise InvalidArgument(f"position must be a positive integer, not {position!r}")
    found = read_events(client.session, dlt_topic, partition, position=position, limit=1)
    if not found or found[0].position != position:
        raise InvalidArgument(f"{dlt_topic!r} holds no event at partition {partition}, position {position}")
    ev = found[0]
    target = to or ev.headers.get(DLT_TOPIC)
    if not target:
        raise InvalidArgument(f"dead letter {dlt_topic}/{partition}/{position} has no dlt.topic header: "
                              "say where to replay it")
    headers = original_headers(ev.headers)
    headers[REPLAYED_FROM] = f"{dlt_topic}/{partition}/{position}"
    headers[REPLAYED_AT] = datetime.now(timezone.utc).isoformat()
    return client.publish(target, ev.value, key=ev.key, headers=headers, event_type=ev.event_type,
                          event_id=f"replay:{dlt_topic}/{partition}/{position}",
                          correlation_id=ev.correlation_id, causation_id=ev.causation_id)


class DeadLetterAdmin:
    """The replay of dead letters of :class:`pgstreams.Client` (a mixin: the client publishes the copies)."""

    def replay_dead_letters(self: SessionPublisher, dlt_topic: str, *, to: str | None = None,
                            group: str | None = None, where_error_type: str | None = None,
                            dry_run: bool = False, max_events: int | None = None) -> ReplayResult:
        """Publish the dead letters of ``dlt_topic`` back to their original topic (``to``: another one), with
        their original key, value and headers, recording the replay in the header ``dlt.replayed_from``.
        See :func:`pgstreams.admin.replay_dead_letters` for the defaults and how each one is replayed
        exactly once."""
        return replay_dead_letters(self, dlt_topic, to=to, group=group, where_error_type=where_error_type,
                                   dry_run=dry_run, max_events=max_events)

    def replay_dead_letter(self: SessionPublisher, dlt_topic: str, partition: int, position: int, *,
                           to: str | None = None) -> PublishResult:
        """Replay one dead letter (at ``partition`` and ``position`` of ``dlt_topic``) to its original
        topic (or ``to``), as :meth:`replay_dead_letters` replays each: the same key, value, headers
        (without ``dlt.*``, plus ``dlt.replayed_from`` and ``dlt.replayed_at``) and ids, under the event id
        ``replay:<dlt topic>/<partition>/<position>``, so the replay is recorded and happens once (a
        second one, or a later replay of every dead letter, returns the first copy with
        ``duplicate=True``). Raises :class:`InvalidArgument` when there is no event there."""
        return replay_dead_letter(self, dlt_topic, partition, position, to=to)
