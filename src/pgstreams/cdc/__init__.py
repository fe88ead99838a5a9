"""Change data capture: every change of chosen tables as events, exactly once, from PostgreSQL's own
logical decoding (the built-in ``pgoutput`` plugin; no extension, so managed PostgreSQL works too).

- :mod:`.admin`: :class:`Cdc` (``client.cdc``: add, list, describe, remove captures; the slot guard;
  capturers and services), :class:`CaptureInfo`, :class:`SlotAlarm`;
- :mod:`.capture`: :class:`Capturer` (a capture's lock and rounds: peek, store events and position in one
  transaction, advance the slot) and :class:`CaptureService`;
- :mod:`.snapshots`: incremental snapshots (chunks by key between watermarks in the stream, DBLog's
  method): :class:`SnapshotStatus`;
- :mod:`.events`: changes to events in the form of Debezium's;
- :mod:`.pgoutput`: the decoder of pgoutput's messages;
- :mod:`.values`: column values (text) to JSON by type.

docs/cdc.md describes setup, the event format, the guarantees and the limits.
"""

from __future__ import annotations

from .admin import (
    DEFAULT_CDC_PARTITIONS,
    DEFAULT_GUARD_INTERVAL,
    DEFAULT_MAX_RETAINED,
    DEFAULT_SNAPSHOT,
    DEFAULT_TOPIC_PREFIX,
    CaptureInfo,
    Cdc,
    SlotAlarm,
    Snapshot,
    slot_name,
)
from .capture import (
    DEFAULT_BATCH,
    DEFAULT_CAPTURE_INTERVAL,
    DEFAULT_TAKEOVER_INTERVAL,
    CaptureLost,
    CaptureNotFound,
    Capturer,
    CaptureService,
    Round,
)
from .events import LSN_HEADER, TXID_HEADER, UNCHANGED_TOAST, topic_name
from .snapshots import DEFAULT_CHUNK_SIZE, SnapshotStatus

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CAPTURE_INTERVAL",
    "DEFAULT_CDC_PARTITIONS",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_GUARD_INTERVAL",
    "DEFAULT_MAX_RETAINED",
    "DEFAULT_SNAPSHOT",
    "DEFAULT_TAKEOVER_INTERVAL",
    "DEFAULT_TOPIC_PREFIX",
    "LSN_HEADER",
    "TXID_HEADER",
    "UNCHANGED_TOAST",
    "CaptureInfo",
    "CaptureLost",
    "CaptureNotFound",
    "CaptureService",
    "Capturer",
    "Cdc",
    "Round",
    "SlotAlarm",
    "Snapshot",
    "SnapshotStatus",
    "slot_name",
    "topic_name",
]
