"""Names in the broker: parking queues, the registry, and the header of a parked copy.

A parking queue is named by a digest of its semaphore key: short, made only of
characters every broker accepts in a queue name, and the same in every process.

    >>> parking_queue("redislock:{0b7ec688eeb9119f}:s:reports")
    'redislock.parking.431b972674768cfc2168ee79'
"""

from __future__ import annotations

import hashlib

#: Every parking queue's name starts with this.
PARKING_PREFIX = "redislock.parking."

#: Redis broker: the hash of parking queues (queue name -> semaphore key).
#: RabbitMQ: the queue of registry entries (one message per parking queue).
REGISTRY = "redislock.parking"

#: Redis broker: where a parked message whose target cannot be read is set aside.
UNROUTABLE = "redislock.parking.unroutable"

#: Redis broker: prefix of the short-lived keys that make a retried park or move happen once.
DONE_PREFIX = "redislock.parking.done."

#: The header of a parked copy that names where it goes back to (see :class:`~.copy.Route`).
ROUTE_HEADER = "redislock_park"


def parking_queue(semaphore_key: str) -> str:
    """The name of ``semaphore_key``'s parking queue: ``redislock.parking.`` and 24 hex
    digits (96 bits of BLAKE2b of the key), deterministic across processes and hosts."""
    digest = hashlib.blake2b(semaphore_key.encode("utf-8"), digest_size=12).hexdigest()
    return PARKING_PREFIX + digest


def is_parking_queue(name: str) -> bool:
    """Whether ``name`` is a parking queue's name (not the registry's).

        >>> is_parking_queue(parking_queue("k")), is_parking_queue("celery")
        (True, False)
    """
    return name.startswith(PARKING_PREFIX) and len(name) == len(PARKING_PREFIX) + 24
