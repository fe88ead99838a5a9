"""Roles: granting PostgreSQL roles the rights to produce, consume and administer (behind the
:class:`GrantAdmin` methods of :class:`pgstreams.Client` and the ``pgstreams grant`` / ``revoke``
commands; see docs/security.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg

from ..errors import InvalidArgument, TopicNotFound
from ..names import check_group, check_topic
from ..ports import HasSession
from ..session import denied

#: The privileges :meth:`pgstreams.Client.grant` gives (see ``0011_roles.sql``).
PRIVILEGES = ("produce", "consume", "admin")

#: One grant: the privilege, its topic (``None``: every topic) and its group (consume grants only).
Grant = tuple[str, str | None, str | None]


@contextmanager
def _grant_errors(role: str, topic: str | None) -> Iterator[None]:
    """A missing role or topic of a grant as :class:`InvalidArgument` / :class:`TopicNotFound`."""
    try:
        yield
    except psycopg.errors.UndefinedObject:
        raise InvalidArgument(f"role {role!r} does not exist (CREATE ROLE it first)") from None
    except psycopg.errors.NoDataFound:
        raise TopicNotFound(f"topic {topic!r} does not exist") from None


def grants_of(role: object, produce: Iterable[str], consume: object, topics: Iterable[str], admin: object,
              revoking: bool = False) -> list[Grant]:
    """The grants the arguments of :meth:`pgstreams.Client.grant` (``revoking``: of
    :meth:`~pgstreams.Client.revoke`) stand for, validated (:class:`InvalidArgument`, names)."""
    if not isinstance(role, str) or not 0 < len(role.encode("utf-8", "surrogatepass")) <= 63 or (
            "\x00" in role):
        raise InvalidArgument(f"role must be a PostgreSQL role name (1 to 63 bytes), got {role!r}")
    if not isinstance(admin, bool):
        raise InvalidArgument(f"admin must be True or False, not {admin!r}")
    produce = [produce] if isinstance(produce, str) else list(produce)
    topics = [topics] if isinstance(topics, str) else list(topics)
    for t in produce + topics:
        check_topic(t)
    out: list[Grant] = [("produce", t, None) for t in produce]
    if consume is not None:
        check_group(consume)
        if not topics and not revoking:
            raise InvalidArgument("consume needs the topics the group reads (topics=[...] / --topic)")
        out += [("consume", t, str(consume)) for t in topics] or [("consume", None, str(consume))]
    elif topics:
        raise InvalidArgument("topics are the topics of a consume grant: give the group too")
    if admin:
        out.append(("admin", None, None))
    if not out:
        raise InvalidArgument("nothing to grant: give produce topics, a consume group or admin")
    return out


class GrantAdmin:
    """The grants of :class:`pgstreams.Client` (a mixin over its session)."""

    def grant(self: HasSession, role: str, *, produce: Iterable[str] = (), consume: str | None = None,
              topics: Iterable[str] = (), admin: bool = False) -> None:
        """Grant PostgreSQL role ``role`` (which must exist) the right to publish to the ``produce`` topics,
        to read ``topics`` and store checkpoints, leases and losses as group ``consume`` (and use share group
        ``consume`` of ``topics``: acquire, ack, release, reject, renew), and/or (``admin``)
        to do everything (create, alter and delete topics, reset and delete groups, maintenance). Defaults:
        nothing of each. Enforced by PostgreSQL (grants, row-level security; see docs/security.md), not by
        the client. Needs the admin right itself. All or nothing."""
        operations = self.session.store.operations
        for privilege, topic, group in grants_of(role, produce, consume, topics, admin):
            with denied(f"grant {privilege} rights to role {role!r}"), _grant_errors(role, topic):
                operations.grant(role, privilege, topic, group)

    def revoke(self: HasSession, role: str, *, produce: Iterable[str] = (), consume: str | None = None,
               topics: Iterable[str] = (), admin: bool = False) -> int:
        """Take back what :meth:`grant` gave (same arguments; ``consume`` without ``topics``: on every
        topic). Returns how many grants were revoked."""
        operations = self.session.store.operations
        n = 0
        for privilege, topic, group in grants_of(role, produce, consume, topics, admin, revoking=True):
            with denied(f"revoke {privilege} rights of role {role!r}"), _grant_errors(role, topic):
                n += operations.revoke(role, privilege, topic, group)
        return n
