"""Exceptions raised by pgstreams.

Every error derives from :class:`PgStreamsError`; errors about bad input also derive from the built-in
exception a Python user would expect (``ValueError``, ``LookupError``), so callers may catch either.
"""

from __future__ import annotations


class PgStreamsError(Exception):
    """Base class of every pgstreams error."""


class InvalidName(PgStreamsError, ValueError):
    """A topic, group or schema name is not valid (raised before any SQL is sent)."""


class InvalidArgument(PgStreamsError, ValueError):
    """An argument has a bad value or type (raised before anything is changed)."""


class TopicNotFound(PgStreamsError, LookupError):
    """The named topic does not exist."""


class GroupNotFound(PgStreamsError, LookupError):
    """The named group has no checkpoints."""


class TopicConflict(PgStreamsError, ValueError):
    """``create_topic`` was called for an existing topic with a different definition."""


class ConfigurationError(PgStreamsError):
    """pgstreams cannot reach or prepare its database (bad DSN, embedded server failure, ...)."""


class MigrationError(PgStreamsError):
    """The database schema is missing, older or newer than this version of pgstreams expects."""


class InvalidConfig(InvalidArgument):
    """A topic configuration key is unknown or its value is bad (the message names the key)."""


class MessageTooLarge(InvalidArgument):
    """An event is larger than its topic's ``max.message.bytes``; nothing was stored."""


class KeyRequired(InvalidArgument):
    """An event without a key was published to a compacted topic (``cleanup.policy`` ``compact`` or
    ``compact,delete``); nothing was stored."""


class GroupActive(PgStreamsError):
    """A group administration command was refused because the group has live members."""


class DataLoss(PgStreamsError):
    """Events a reader needed were removed by retention before it read them (Spark's
    ``failOnDataLoss=true``)."""


class ConnectionLost(PgStreamsError):
    """PostgreSQL could not be reached for longer than the client's ``retry_timeout``: the call was retried
    on fresh connections until then. The message names the server (never its password); the last
    connection error is the ``__cause__``."""


class ClientClosed(PgStreamsError):
    """The client was closed (``close()``, or the end of its ``with`` block) and was used again, or one of
    its consumers, producers or workers was: make a new client with :func:`pgstreams.connect`."""


class PermissionDenied(PgStreamsError):
    """PostgreSQL refused an action to the connected role (see ``pgstreams grant``); the message names the
    action and the object (topic, group or table). Nothing was changed."""


class ShardUnavailable(ConnectionLost):
    """A shard of a cluster could not be reached (at connect, or for longer than the client's
    ``retry_timeout``). The message names the shard by its place and server, never its password. Events
    routed to it are never sent to another shard instead (that would break the order of their keys)."""


class LayoutMismatch(ConfigurationError):
    """The servers given to a cluster client (or to ``pgstreams cluster init``) do not match the cluster
    layout the shards recorded: a server of no cluster or of another one, shards in another order, too
    few or too many. The message names the mismatch. Nothing was changed."""
