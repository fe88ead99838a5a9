"""How a topic is stored: the one place that knows the names of its table, segments and sequence.

A topic with id ``N`` keeps its events in ``<schema>.topic_N``, partitioned by range of position into
segments ``<schema>.topic_N_s<k>`` (positions ``[k * segment_size, (k + 1) * segment_size)``), and numbers
them from the sequence ``<schema>.topic_N_seq``. The SQL functions of the migrations that create and
extend this storage (``create_topic_storage``, ``ensure_segments``) follow the same scheme. Consumers of a
schema wait for its events on the notification channel ``pgstreams.<schema>``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from psycopg import sql


def notification_channel(schema: str) -> str:
    """The channel on which publishers of ``schema`` announce topics that received events."""
    return f"pgstreams.{schema}"


@dataclass(frozen=True)
class TopicTables:
    """The storage names of topic ``topic_id`` in ``schema``."""

    schema: str
    topic_id: int

    @property
    def base(self) -> str:
        """The bare name of the event table (``topic_<id>``)."""
        return f"topic_{int(self.topic_id)}"

    @property
    def table(self) -> sql.Identifier:
        """The event table (partitioned by position into segments)."""
        return sql.Identifier(self.schema, self.base)

    @property
    def table_regclass(self) -> str:
        """The event table's qualified, quoted name as a text value for ``::regclass``."""
        return f'"{self.schema}"."{self.base}"'

    @property
    def sequence(self) -> sql.Identifier:
        """The sequence that numbers the topic's positions."""
        return sql.Identifier(self.schema, f"{self.base}_seq")

    @property
    def sequence_regclass(self) -> str:
        """The sequence's qualified, quoted name as a text value for ``::regclass`` (``nextval(%s)``)."""
        return f'"{self.schema}"."{self.base}_seq"'

    @property
    def segment_prefix(self) -> str:
        """The bare name of segment ``k`` without ``k`` (segment names are this prefix and the number)."""
        return f"{self.base}_s"

    def segment(self, index: int) -> sql.Identifier:
        """Segment ``index`` of the event table."""
        return sql.Identifier(self.schema, f"{self.segment_prefix}{int(index)}")

    @functools.cached_property
    def identifiers(self) -> dict[str, sql.Composable]:
        """The placeholders of per-topic queries: ``{table}`` and ``{seq}`` (identifiers), ``{topic_id}``
        and ``{seq_name}`` (literals: the topic id, the sequence's name for ``::regclass``)."""
        return {"table": self.table, "seq": self.sequence, "topic_id": sql.Literal(int(self.topic_id)),
                "seq_name": sql.Literal(self.sequence_regclass)}
