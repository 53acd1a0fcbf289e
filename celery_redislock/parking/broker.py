"""The parking operations of one broker connection, and what each did.

Each operation blocks on the network: call them from a thread (the :class:`~.mover.Mover`,
the poll), never from the worker's event loop. :func:`~.transport.broker_for` gives the
one for a kombu connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Protocol, Tuple

from .parked_copy import ParkedCopy


@dataclass(frozen=True)
class Outcome:
    """What one park or move did.

    * ``done``: park: the copy is in its parking queue; move: one message left the
      parking queue for its target (False: the queue was empty, or its head could not
      be routed and was set aside: the caller gives the reservation back);
    * ``what``: ``"parked"``, ``"moved"``, ``"empty"``, ``"unroutable"``, or
      ``"parked before"`` / ``"moved before"`` / ``"empty before"`` (a retried job the
      broker had already done: reported, not done twice);
    * ``target``: a move's destination (Redis: the list; RabbitMQ: ``exchange/key``);
    * ``doubt``: the broker may now hold two copies of the message (RabbitMQ: the
      connection broke after a publish and before its confirm, or before the ack of a
      move): harmless because the lock store's reference makes the second one stale.
    """

    done: bool
    what: str
    target: str = ""
    doubt: bool = False


@dataclass(frozen=True)
class Restored:
    """What one put-back round of moved copies' backups found (Redis broker):

    * ``put_back``: ``[(new move id, parking queue)]``, the copies no worker received in
      time, back at the front of their parking queues;
    * ``late``: ``[(move id, line)]``, the copies seen still in the queue they were
      moved to (the workers are busy), a queue some running worker consumes: late, not
      lost; the poll keeps their reservations;
    * ``due``: how many backups were due (as many as asked for: more may be);
    * ``presumed``: as ``late``, the copies in a queue too long to look in (counted as
      still there; their reservations are kept for a bounded time only).
    """

    put_back: List[Tuple[str, str]] = field(default_factory=list)
    late: List[Tuple[str, str]] = field(default_factory=list)
    due: int = 0
    presumed: List[Tuple[str, str]] = field(default_factory=list)


class ParkingBroker(Protocol):
    """The broker side of the parking line on one connection (see the package doc)."""

    def park(self, copy: ParkedCopy, job_id: str) -> Outcome:
        """Publish ``copy`` into ``copy.queue`` (declared, registered); ``job_id`` names
        this park, so that a retry after a lost connection does not publish it twice
        where the broker allows it (Redis)."""

    def move(self, queue: str, job_id: str) -> Outcome:
        """Move the oldest message of parking queue ``queue`` back to its target."""

    def claimed(self, move: str) -> bool:
        """A worker received the moved copy ``move`` (its move id; kombu holds it now):
        its backup is dropped (Redis; True if it was there). RabbitMQ keeps none."""

    def restore(self, limit: int = ..., consumed: Iterable[str] = ...) -> Restored:
        """Put back at the front of their parking queues the moved messages whose copy
        no worker received in time, and say which copies are late (Redis; RabbitMQ:
        nothing); ``consumed``: the queues the caller's worker consumes."""

    def lengths(self, queues: Iterable[str]) -> Dict[str, int]:
        """How many messages each parking queue holds (0 for one that does not exist)."""

    def registry(self, max_age: float = ...) -> Dict[str, str]:
        """Every parking queue the broker knows of, with its semaphore key (RabbitMQ:
        as read at most ``max_age`` seconds ago, 30 by default, and the queues this
        connection parked into; ``max_age=0`` reads it now)."""
