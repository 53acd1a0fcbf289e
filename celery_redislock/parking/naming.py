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

#: Redis broker: prefix of a moved message's backup (a hash: its parking list, the message),
#: kept until a worker that received the copy claims it, or it is put back.
MOVED_PREFIX = "redislock.parking.moved."

#: Redis broker: the sorted set of backups by when each is put back (ms, broker's clock).
MOVING = "redislock.parking.moving"

#: The queues running workers consume (Redis broker: a sorted set, the queue's list ->
#: until when, ms), renewed by each worker's poll: a late copy is kept only there.
CONSUMED = "redislock.parking.consumed"

#: The header of a parked copy that names where it goes back to (see :class:`~.copy.Route`).
ROUTE_HEADER = "redislock_park"

#: The header that carries a run's wait so far (read and written by the integration's
#: ``WaitingRun``; a parked copy's is replaced by the wait it parks with).
WAIT_HEADER = "redislock_wait"


#: Between a semaphore key and a sub-line's key in the name of a fair sub-line's line.
SUB_SEPARATOR = "\x1f"


def line_name(semaphore_key: str, sub: str = "") -> str:
    """The name of the line a parked copy waits in: the semaphore key, or for a fair
    line's sub-line (``sub``, e.g. ``"tenant:acme"``) the key and the sub-line; a
    parking queue is named by it (:func:`parking_queue`), and the registry maps the
    queue back to it.

        >>> line_name("k"), line_name("k", "tenant:a"), key_of_line(line_name("k", "t"))
        ('k', 'k\\x1ftenant:a', 'k')
    """
    return f"{semaphore_key}{SUB_SEPARATOR}{sub}" if sub else semaphore_key


def key_of_line(line: str) -> str:
    """The semaphore key of a line's name (:func:`line_name`)."""
    return line.partition(SUB_SEPARATOR)[0]


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
