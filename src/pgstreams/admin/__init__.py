"""Administration: what :class:`pgstreams.Client` does beyond publishing and consuming, by concern.

Each module holds the operations of one concern over a session and a mixin of :class:`pgstreams.Client`
with their public methods (the client is the facade; these take its session):

- :mod:`.topics`: :class:`TopicAdmin` (create, alter, describe, list and delete topics, retention status,
  reading a partition without a group) and the checks of a topic's definition;
- :mod:`.groups`: :class:`GroupAdmin` (describe and list stream groups; :func:`reset_group` and
  :func:`delete_group`, as Kafka's ``kafka-consumer-groups --reset-offsets`` / ``--delete``);
- :mod:`.shares`: :class:`ShareAdmin` (share consumers, queues, share groups' status);
- :mod:`.grants`: :class:`GrantAdmin` (the rights of PostgreSQL roles);
- :mod:`.deadletters`: :class:`DeadLetterAdmin` (:func:`replay_dead_letters`, :func:`replay_dead_letter`).
"""

from __future__ import annotations

from ..dltheaders import original_headers
from .deadletters import (
    DEFAULT_REPLAY_GROUP,
    REPLAY_BATCH,
    REPLAYED_AT,
    REPLAYED_FROM,
    DeadLetterAdmin,
    replay_dead_letter,
    replay_dead_letters,
)
from .grants import PRIVILEGES, GrantAdmin
from .groups import GroupAdmin, delete_group, reset_group
from .shares import ShareAdmin
from .topics import DEFAULT_BROWSE_LIMIT, TopicAdmin, check_same_topic, topic_definition

__all__ = [
    "DEFAULT_BROWSE_LIMIT",
    "DEFAULT_REPLAY_GROUP",
    "PRIVILEGES",
    "REPLAYED_AT",
    "REPLAYED_FROM",
    "REPLAY_BATCH",
    "DeadLetterAdmin",
    "GrantAdmin",
    "GroupAdmin",
    "ShareAdmin",
    "TopicAdmin",
    "check_same_topic",
    "delete_group",
    "original_headers",
    "replay_dead_letter",
    "replay_dead_letters",
    "reset_group",
    "topic_definition",
]
