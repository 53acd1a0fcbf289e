"""What the poll asks of the broker: how many runs each line has parked.

The lock store's poll (:func:`celery_redislock.engine.parking.due`) takes the lengths
by semaphore key; the recount after the store lost its data takes every line the
broker's registry knows. Both block on the broker: call them from the poll's thread.

    >>> from kombu import Connection
    >>> with Connection(redis_url) as connection:
    ...     broker = broker_for(connection)
    ...     parked_lengths(broker, ["redislock:{k}:s:x"]), recount(broker)
    ({'redislock:{k}:s:x': 0}, {})
"""

from __future__ import annotations

from typing import Dict, Iterable

from .broker import ParkingBroker
from .naming import parking_queue
from .transport import broker_for  # noqa: F401  (the doctest's)


def parked_lengths(broker: ParkingBroker, keys: Iterable[str]) -> Dict[str, int]:
    """``{semaphore key: messages in its parking queue}`` for ``keys`` (0 for a queue
    that does not exist), as :func:`~celery_redislock.engine.parking.due` takes them."""
    queues = {parking_queue(key): key for key in keys}
    return {queues[queue]: n for queue, n in broker.lengths(list(queues)).items()}


def recount(broker: ParkingBroker, max_age: float = 30.0) -> Dict[str, int]:
    """``{semaphore key: messages parked}`` for every parking queue the broker's
    registry knows that holds any (after the lock store lost its data: its index of
    parked keys is gone, the broker's registry is not). On RabbitMQ the registry is read
    again at most every ``max_age`` seconds (a ``basic.get`` per entry), the lengths
    each call (a passive ``queue.declare`` per queue); on Redis both in two calls."""
    known = broker.registry(max_age=max_age)
    lengths = broker.lengths(list(known))
    return {known[queue]: n for queue, n in lengths.items() if n > 0}
