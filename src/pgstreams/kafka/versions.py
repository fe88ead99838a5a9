"""The one table of the Kafka APIs the gateway serves: dispatch and the ``ApiVersions`` reply are both built
from :data:`SERVED`, so the gateway never advertises a version it does not implement (a client that is told
a version is served sends it, and waits for a reply it cannot parse)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ApiRange:
    """An API the gateway serves: its Kafka key, name (as in Kafka's message schemas) and the versions
    served, inclusive."""

    key: int
    name: str
    min_version: int
    max_version: int

    def serves(self, version: int) -> bool:
        """Whether ``version`` of this API is served."""
        return self.min_version <= version <= self.max_version


#: Every API served, by key. Versions are those of Kafka's schemas (through ``kio``, and
#: :mod:`pgstreams.kafka.schemas` for the ones ``kio`` lacks) that the gateway's handlers implement; Kafka 4
#: itself no longer serves the oldest ones.
SERVED: Final[dict[int, ApiRange]] = {
    r.key: r
    for r in (
        ApiRange(0, "produce", 0, 9),
        ApiRange(1, "fetch", 4, 12),
        ApiRange(2, "list_offsets", 1, 6),
        ApiRange(3, "metadata", 0, 12),
        ApiRange(8, "offset_commit", 2, 8),
        ApiRange(9, "offset_fetch", 1, 7),
        ApiRange(10, "find_coordinator", 0, 4),
        ApiRange(11, "join_group", 2, 7),
        ApiRange(12, "heartbeat", 0, 4),
        ApiRange(13, "leave_group", 0, 4),
        ApiRange(14, "sync_group", 0, 5),
        ApiRange(15, "describe_groups", 0, 5),
        ApiRange(16, "list_groups", 0, 4),
        ApiRange(17, "sasl_handshake", 0, 1),
        ApiRange(18, "api_versions", 0, 3),
        ApiRange(19, "create_topics", 2, 7),
        ApiRange(20, "delete_topics", 1, 5),
        ApiRange(22, "init_producer_id", 0, 4),
        ApiRange(24, "add_partitions_to_txn", 0, 3),
        ApiRange(25, "add_offsets_to_txn", 0, 3),
        ApiRange(26, "end_txn", 0, 3),
        ApiRange(28, "txn_offset_commit", 0, 3),
        ApiRange(32, "describe_configs", 1, 4),
        ApiRange(33, "alter_configs", 0, 2),
        ApiRange(36, "sasl_authenticate", 0, 2),
        ApiRange(37, "create_partitions", 0, 3),
        ApiRange(44, "incremental_alter_configs", 0, 1),
    )
}

#: The API key of ``ApiVersions``: its reply header is always version 0, and an unsupported version of it
#: is answered in version 0 (Kafka's rule, so that a client can learn what to send).
API_VERSIONS_KEY: Final = 18


def served(key: int, version: int) -> ApiRange | None:
    """The API of ``key`` when ``version`` of it is served, else ``None``."""
    api = SERVED.get(key)
    return api if api is not None and api.serves(version) else None
