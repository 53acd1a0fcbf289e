"""The parking operations for a kombu connection's transport.

    >>> from kombu import Connection
    >>> with Connection(redis_url) as connection:  # a Redis broker
    ...     broker = broker_for(connection)
    ...     broker.move(parking_queue("redislock:{k}:s:x"), job_id="j1")
    Outcome(done=False, what='empty', target='', doubt=False)
"""

from __future__ import annotations

from typing import Any

from .amqp_line import AmqpParking
from .broker import ParkingBroker
from .naming import parking_queue  # noqa: F401  (the doctest's)
from .redis_line import RedisParking


def broker_for(connection: Any) -> ParkingBroker:
    """The parking operations for kombu ``connection``'s transport: a Redis broker
    (``redis``, ``rediss``, ``sentinel``) or an AMQP one (RabbitMQ through
    ``pyamqp``/``amqp``); the same object for the same connection (no new channel per
    call). Not thread-safe: one thread per connection."""
    found: Any = getattr(connection, _ATTRIBUTE, None)
    if found is None:
        found = _make(connection)
        setattr(connection, _ATTRIBUTE, found)
    return found  # type: ignore[no-any-return]


#: Where a connection keeps its parking operations (one channel each, not one per call).
_ATTRIBUTE = "_redislock_parking"


def _make(connection: Any) -> ParkingBroker:
    driver = connection.transport.driver_type
    if driver == "redis":
        return RedisParking(connection)
    if driver == "amqp":
        return AmqpParking(connection)
    raise NotImplementedError(f"the parking line does not support the {driver!r} "
                              "transport (Redis and AMQP brokers only)")
