"""The membership services: a member's heartbeat and its balancing rounds, each a :class:`Service`."""

from __future__ import annotations

import logging
import time

import psycopg
from psycopg_pool import PoolTimeout

from ..errors import ConnectionLost
from ..services import Service
from .members import GroupMember

log = logging.getLogger("pgstreams.groups")


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (psycopg.OperationalError, psycopg.errors.DeadlockDetected,
                            psycopg.errors.SerializationFailure, psycopg.errors.LockNotAvailable,
                            ConnectionLost, PoolTimeout))


class HeartbeatService(Service):
    """Heartbeats a member every ``heartbeat_interval``; while it waits for a hand-over it also reads its
    leases every fifth of the interval, so it starts on a partition soon after the owner released it.
    Connection errors are logged and retried at the next tick; anything else kills the service."""

    def __init__(self, member: GroupMember) -> None:
        super().__init__(f"heartbeat:{member.group}/{member.topic}")
        self.member = member
        self._next = 0.0

    def step(self) -> None:
        now = time.monotonic()
        try:
            if now >= self._next:
                self._next = now + self.member.heartbeat_interval
                self.member.heartbeat()
            elif self.member.leases.incoming:
                self.member.refresh()
        except Exception as exc:
            if not _transient(exc):
                raise
            log.warning("heartbeat of %s failed (will retry): %s", self.member.member_id, exc)

    def interval(self) -> float:
        until = max(0.0, self._next - time.monotonic())
        if self.member.leases.incoming:
            return min(until, self.member.heartbeat_interval / 5)
        return until


class BalancerService(Service):
    """Runs a balancing round for a member every ``heartbeat_interval`` (expire, claim, steal)."""

    def __init__(self, member: GroupMember) -> None:
        super().__init__(f"balancer:{member.group}/{member.topic}", interval=member.heartbeat_interval)
        self.member = member

    def step(self) -> None:
        try:
            self.member.balance()
        except Exception as exc:
            if not _transient(exc):
                raise
            log.warning("balancing of %s failed (will retry): %s", self.member.member_id, exc)
