"""A parked copy: the original message as a worker received it, with its wait replaced.

:meth:`ParkedCopy.of` reads a kombu message (any transport) in the worker's main
process, without the network: the body as received (decompressed: the ``compression``
header is dropped, as kombu does when it restores a message), content type and
encoding, the headers with ``redislock_wait`` replaced by the caller's dict, the
properties Celery reads (``priority``, ``correlation_id``, ``reply_to``,
``delivery_mode``...; not ``expiration``: a parked copy must not expire while it
waits, and not ``user_id``, which RabbitMQ checks against the publishing connection),
and its :class:`Route`: the exchange and routing key it was delivered with. The
broker side (:mod:`.redis_line`, :mod:`.amqp_line`) writes the route into the copy's
``redislock_park`` header, so that the copy moved back has the original's
``delivery_info`` and ``self.retry()`` publishes where the original was sent.

    >>> from kombu import Message
    >>> original = Message(body=b'[[1], {}, {}]', content_type="application/json",
    ...                    content_encoding="utf-8", headers={"id": "t1", "task": "x"},
    ...                    properties={"priority": 3, "correlation_id": "t1"},
    ...                    delivery_info={"exchange": "", "routing_key": "celery"})
    >>> copy = ParkedCopy.of(original, "redislock:{k}:s:x", {"v": 2, "park_id": "p1"})
    >>> copy.route, copy.priority
    (Route(exchange='', routing_key='celery', queue=''), 3)
    >>> copy.headers["redislock_wait"], copy.headers["task"]
    ({'v': 2, 'park_id': 'p1'}, 'x')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from .naming import ROUTE_HEADER, WAIT_HEADER, parking_queue

#: The message properties a parked copy keeps (Celery reads priority, correlation_id,
#: reply_to; the others are kept as sent).
KEPT_PROPERTIES = ("priority", "delivery_mode", "correlation_id", "reply_to", "message_id",
                   "type", "app_id")


@dataclass(frozen=True)
class Route:
    """Where a parked copy goes back to: the exchange and routing key the original was
    delivered with, and (Redis broker) the queue it was consumed from when known
    (``""``: found from the exchange's bindings when parked, as kombu routes).

        >>> Route.parse({"exchange": "celery", "routing_key": "celery", "queue": "q",
        ...              "list": "q"})
        Route(exchange='celery', routing_key='celery', queue='q')
        >>> Route.parse("junk") is None
        True
    """

    exchange: str
    routing_key: str
    queue: str = ""

    def header(self, **extra: Any) -> Dict[str, Any]:
        """The ``redislock_park`` header's value (with ``extra`` fields)."""
        return {"exchange": self.exchange, "routing_key": self.routing_key,
                "queue": self.queue, **extra}

    @classmethod
    def parse(cls, value: Any) -> Optional[Route]:
        """A route from a ``redislock_park`` header's value; None if unreadable."""
        if not isinstance(value, Mapping):
            return None
        exchange, routing_key = value.get("exchange"), value.get("routing_key")
        if not isinstance(exchange, str) or not isinstance(routing_key, str):
            return None
        queue = value.get("queue")
        return cls(exchange, routing_key, queue if isinstance(queue, str) else "")


@dataclass(frozen=True)
class ParkedCopy:
    """What is published into a parking queue: built by :meth:`of`, published by a
    :class:`~.mover.Mover` (or :meth:`~.broker.ParkingBroker.park`)."""

    key: str                      # the semaphore key whose line it waits in
    queue: str                    # its parking queue (parking_queue(key))
    body: bytes
    content_type: str
    content_encoding: str
    headers: Mapping[str, Any]    # with the caller's wait header, without ROUTE_HEADER
    properties: Mapping[str, Any] = field(default_factory=dict)
    route: Route = Route("", "")
    attempt: Optional[int] = None  # the run's attempt (Celery's ``retries``) when parked

    @property
    def priority(self) -> Optional[int]:
        value = self.properties.get("priority")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @classmethod
    def of(cls, message: Any, key: str, wait: Mapping[str, Any], queue: str = "",
           attempt: Optional[int] = None) -> ParkedCopy:
        """The parked copy of kombu ``message`` in ``key``'s line, its ``redislock_wait``
        header replaced by ``wait``; ``queue``: the queue the message was consumed from,
        if the caller knows it (else found from its route by the broker side);
        ``attempt``: the run's ``retries`` (default: Celery's ``retries`` header)."""
        delivery_info = getattr(message, "delivery_info", None) or {}
        properties = getattr(message, "properties", None) or {}
        headers = dict(getattr(message, "headers", None) or {})
        for dropped in ("compression", ROUTE_HEADER):
            headers.pop(dropped, None)
        headers[WAIT_HEADER] = dict(wait)
        body = message.body
        if isinstance(body, str):
            body = body.encode(getattr(message, "content_encoding", None) or "utf-8")
        kept = {name: properties[name] for name in KEPT_PROPERTIES
                if properties.get(name) is not None}
        route = Route(str(delivery_info.get("exchange") or ""),
                      str(delivery_info.get("routing_key") or ""), queue)
        if attempt is None:
            attempt = _attempt(headers.get("retries"))
        return cls(key=key, queue=parking_queue(key), body=bytes(body),
                   content_type=message.content_type or "application/octet-stream",
                   content_encoding=message.content_encoding or "binary",
                   headers=headers, properties=kept, route=route, attempt=attempt)

    def route_header(self, **extra: Any) -> Dict[str, Any]:
        """The ``redislock_park`` header of this copy: its route and attempt."""
        return self.route.header(attempt=self.attempt, **extra)


def moved_copy(headers: Any, attempt: Optional[int] = None) -> bool:
    """Whether a message with ``headers`` is a parked copy moved back, as it was parked:
    not a later attempt of its task that inherited them through ``self.retry()``.

    Celery copies a run's custom headers into its retry: the retry of a moved run
    carries the parked copy's ``redislock_wait`` (its park id) and ``redislock_park``,
    but its attempt (``retries``) is one more than the one parked. ``attempt``: the
    run's ``retries`` (default: the ``retries`` header of Celery's protocol 2).

        >>> parked = {"retries": 0, "redislock_park": {"exchange": "", "routing_key": "q",
        ...                                            "attempt": 0}}
        >>> moved_copy(parked), moved_copy({**parked, "retries": 1}), moved_copy({})
        (True, False, False)
    """
    if not isinstance(headers, Mapping):
        return False
    route = headers.get(ROUTE_HEADER)
    if not isinstance(route, Mapping) or Route.parse(route) is None:
        return False
    if attempt is None:
        attempt = _attempt(headers.get("retries"))
    parked = _attempt(route.get("attempt"))
    return parked is not None and parked == attempt


def _attempt(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def stamped(headers: Mapping[str, Any], move: str) -> Dict[str, Any]:
    """``headers`` of a parked message, its wait header given the id ``move`` of the
    copy about to be moved (a wait header that is not a dict is left as it is).

    Two copies of one run must never carry the same id unless one is the other given
    back by the broker: the lock store lets that one copy run again (its admission's
    reply lost, or given back unacknowledged), and ends any other copy of the run unrun.

        >>> stamped({"redislock_wait": {"park_id": "1:2"}, "x": 1}, "m1")
        {'redislock_wait': {'park_id': '1:2', 'move': 'm1'}, 'x': 1}
    """
    wait = headers.get(WAIT_HEADER)
    if not isinstance(wait, Mapping):
        return dict(headers)
    return {**headers, WAIT_HEADER: {**wait, "move": move}}
