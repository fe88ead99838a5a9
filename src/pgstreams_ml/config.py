"""Names of the application's topics, groups and tables, and setting them up."""

from __future__ import annotations

from dataclasses import dataclass

import pgstreams
from pgstreams.names import check_group, check_partitions, check_schema, check_topic

from . import _sql


@dataclass(frozen=True)
class Topology:
    """Where everything lives. Defaults: schema ``ml``; topics ``ml.raw``, ``ml.updates``, ``ml.clean``,
    ``ml.quarantine``, ``ml.predictions`` with 4 partitions each; groups ``ml-enrichment``, ``ml-scorer``,
    ``ml-clean``, ``ml-join``, ``ml-monitor``; model name ``ctr``; pgstreams schema ``pgstreams``."""

    schema: str = "ml"
    raw_topic: str = "ml.raw"
    updates_topic: str = "ml.updates"
    clean_topic: str = "ml.clean"
    quarantine_topic: str = "ml.quarantine"
    predictions_topic: str = "ml.predictions"
    partitions: int = 4
    enrichment_group: str = "ml-enrichment"
    scorer_group: str = "ml-scorer"
    clean_group: str = "ml-clean"
    join_group: str = "ml-join"
    monitor_group: str = "ml-monitor"
    model_name: str = "ctr"
    pgstreams_schema: str = "pgstreams"

    def __post_init__(self) -> None:
        check_schema(self.schema)
        check_schema(self.pgstreams_schema)
        for t in self.topics:
            check_topic(t)
        for g in self.groups:
            check_group(g)
        check_partitions(self.partitions)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic of the application."""
        return (
            self.raw_topic,
            self.updates_topic,
            self.clean_topic,
            self.quarantine_topic,
            self.predictions_topic,
        )

    @property
    def monitor_clicks_group(self) -> str:
        """The group of the monitor query's read of the clean topic: ``<monitor_group>.clicks``."""
        return f"{self.monitor_group}.clicks"

    @property
    def groups(self) -> tuple[str, ...]:
        """Every stream group of the application."""
        return (
            self.enrichment_group,
            self.scorer_group,
            self.clean_group,
            self.join_group,
            self.monitor_group,
            self.monitor_clicks_group,
        )


def setup(client: pgstreams.Client, topo: Topology, *, reset: bool = False) -> None:
    """Create the topics and tables of ``topo`` (idempotent). With ``reset``, delete them first, with
    every event, group checkpoint and row (default false)."""
    if reset:
        for t in topo.topics:
            try:
                client.delete_topic(t)
            except pgstreams.TopicNotFound:
                pass
        with client.connection() as conn:
            _sql.drop_schema(conn, topo.schema)
    for t in topo.topics:
        client.create_topic(t, topo.partitions)
    with client.connection() as conn:
        _sql.migrate(conn, topo.schema)
