"""The parking line on an AMQP broker (RabbitMQ): publish with confirms; move = get,
publish, ack.

A parking queue is a durable classic queue, lazy (its messages on disk, not in memory:
a line of 100,000; RabbitMQ 3.12 and later do so for every classic queue and ignore
the argument), declared with ``x-expires`` (7 days by default: a queue nobody parked
into nor moved from for that long is deleted by the broker, with what it holds), which
no worker consumes. A parked copy is published to it through the default exchange with
the original's body and properties (persistent), its route in the ``redislock_park``
header; a move gets the oldest message (``basic.get``, unacknowledged), publishes it
to the original exchange and routing key (mandatory and confirmed: the delivery is the
original's), then acknowledges it. A message no queue takes back
(its queue deleted, its route unreadable) is set aside in the queue
``redislock.parking.unroutable``, never dropped. AMQP cannot put a message at the front
of a queue: the moved run is taken after what its queue already holds. A connection
lost between the publish and its confirm or the ack may leave two copies
(``Outcome.doubt``): the lock store's reference makes the second stale. Each move
stamps the copy it publishes with an id of its own (``move`` in its wait header, see
:func:`.parked_copy.stamped`): the two copies of one move are told apart.

The registry is a durable queue ``redislock.parking`` of small JSON messages
``{"queue", "key"}``, one published by each connection the first time it parks into a
queue (before the copy); :meth:`AmqpParking.registry` reads it whole, acknowledges the
duplicates and the entries of queues that no longer exist, and gives the others back.
Two readers at once may each see part of it; a read is reused for 30 s (``max_age``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from amqp.exceptions import NotFound

from .broker import Outcome, Restored
from .naming import REGISTRY, ROUTE_HEADER, UNROUTABLE
from .parked_copy import ParkedCopy, Route, stamped

logger = logging.getLogger(__name__)

#: How long (s) a publish waits for its confirm (then it fails: tried again, in doubt).
CONFIRM_TIMEOUT = 30.0

#: How long (s) a registry read is reused (see :meth:`AmqpParking.registry`).
REGISTRY_MAX_AGE = 30.0

#: A parking queue unused this long (ms) is deleted by RabbitMQ (``x-expires``).
PARKING_EXPIRES_MS = 7 * 24 * 3600 * 1000


class AmqpParking:
    """:class:`~.broker.ParkingBroker` on kombu ``connection`` to an AMQP broker."""

    def __init__(self, connection: Any, expires_ms: Optional[int] = PARKING_EXPIRES_MS) -> None:
        self.connection = connection
        self.arguments: Dict[str, Any] = {"x-queue-mode": "lazy"}
        if expires_ms:
            self.arguments["x-expires"] = expires_ms
        self._channel: Any = None
        self._declared: Set[str] = set()
        self._registered: Dict[str, str] = {}
        self._registry: Dict[str, str] = {}
        self._registry_read = -float("inf")
        self._probe: Any = None
        self._returned: List[Tuple[str, str]] = []
        #: The last park or move published its copy (the mover's retry reads it).
        self.sent = False

    @property
    def channel(self) -> Any:
        """This instance's channel, opened again if the broker closed it (an error)."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self.connection.channel()
            self._channel.events["basic_return"].add(self._on_return)
            self._declared.clear()
        return self._channel

    def declare(self, queue: str) -> None:
        """Declare parking queue ``queue`` (once per connection)."""
        if queue not in self._declared:
            arguments = self.arguments if queue not in (REGISTRY, UNROUTABLE) else {}
            self.channel.queue_declare(queue, durable=True, auto_delete=False,
                                       arguments=arguments)
            self._declared.add(queue)

    def _publish(self, body: Any, exchange: str, routing_key: str, **properties: Any) -> bool:
        """Publish, mandatory and confirmed; False: no queue took it (the broker gave it
        back, before its confirm)."""
        self._returned.clear()
        message = self.channel.prepare_message(body, **properties)
        self.channel.basic_publish_confirm(message, exchange=exchange,
                                           routing_key=routing_key, mandatory=True,
                                           confirm_timeout=CONFIRM_TIMEOUT)
        return not self._returned

    def _on_return(self, _exc: Any, exchange: str, routing_key: str, _message: Any) -> None:
        self._returned.append((exchange, routing_key))

    def park(self, copy: ParkedCopy, job_id: str) -> Outcome:
        self.sent = False
        self.declare(copy.queue)
        if copy.queue not in self._registered:
            self.declare(REGISTRY)
            self._publish(json.dumps({"queue": copy.queue, "key": copy.key}), "", REGISTRY,
                          content_type="application/json", content_encoding="utf-8",
                          properties={"delivery_mode": 2})
            self._registered[copy.queue] = copy.key
        properties = dict(copy.properties)
        priority = properties.pop("priority", None)
        properties["delivery_mode"] = 2
        self.sent = True
        for _ in range(2):
            if self._publish(copy.body, "", copy.queue, priority=priority,
                             content_type=copy.content_type,
                             content_encoding=copy.content_encoding,
                             headers={**copy.headers, ROUTE_HEADER: copy.route_header()},
                             properties=properties):
                return Outcome(True, "parked")
            self._declared.discard(copy.queue)  # deleted meanwhile (x-expires): again
            self.declare(copy.queue)
        raise RuntimeError(f"parking queue {copy.queue!r} took no message")

    def move(self, queue: str, job_id: str) -> Outcome:
        self.sent = False
        self.declare(queue)
        message = self.channel.basic_get(queue, no_ack=False)
        if message is None:
            return Outcome(False, "empty")
        headers = stamped(message.headers or {}, job_id[:16])  # this copy's id
        route = Route.parse(headers.get(ROUTE_HEADER))
        properties = {name: value for name, value in message.properties.items()
                      if name not in ("application_headers", "content_type",
                                      "content_encoding", "priority")}
        exchange, routing_key = (route.exchange, route.routing_key) if route else ("", "")
        self.sent = True
        publish = functools.partial(
            self._publish, message.body, priority=message.properties.get("priority"),
            content_type=message.content_type, content_encoding=message.content_encoding,
            headers=headers, properties=properties)
        moved = route is not None and publish(exchange, routing_key)
        if not moved:  # no route, or no queue bound to it: set aside, not lost
            logger.warning("redislock: a parked message of %s has no queue to go back to "
                           "(exchange %r, routing key %r): moved to %s", queue, exchange,
                           routing_key, UNROUTABLE)
            self.declare(UNROUTABLE)
            publish("", UNROUTABLE)
        self.channel.basic_ack(message.delivery_tag)
        if not moved:
            return Outcome(False, "unroutable", UNROUTABLE)
        return Outcome(True, "moved", f"{exchange}/{routing_key}")

    def claimed(self, move: str) -> bool:
        """Nothing to do: RabbitMQ has no pop window (a delivery not acknowledged goes
        back to its queue when its consumer's channel closes), so no backup is kept."""
        return False

    def restore(self, limit: int = 0, consumed: Iterable[str] = ()) -> Restored:
        """Nothing to put back (see :meth:`claimed`)."""
        return Restored()

    def lengths(self, queues: Iterable[str]) -> Dict[str, int]:
        return {queue: self._count(queue) or 0 for queue in queues}

    def registry(self, max_age: float = REGISTRY_MAX_AGE) -> Dict[str, str]:
        """The registry as read at most ``max_age`` seconds ago (reading it is one
        ``basic.get`` per entry), with the queues this connection registered since."""
        if time.monotonic() - self._registry_read > max_age:
            self._registry = self._read_registry()
            self._registry_read = time.monotonic()
        return {**self._registry, **self._registered}

    def _read_registry(self) -> Dict[str, str]:
        self.declare(REGISTRY)
        known: Dict[str, str] = {}
        drop = []
        while True:
            message = self.channel.basic_get(REGISTRY, no_ack=False)
            if message is None:
                break
            try:
                entry = json.loads(message.body)
                queue, key = str(entry["queue"]), str(entry["key"])
            except (ValueError, KeyError, TypeError):
                drop.append(message.delivery_tag)
                continue
            if queue in known or self._count(queue) is None:
                drop.append(message.delivery_tag)
            else:
                known[queue] = key
        for tag in drop:
            self.channel.basic_ack(tag)
        self.channel.basic_recover(requeue=True)  # gives back the entries kept
        return known

    def _count(self, queue: str) -> Optional[int]:
        """How many messages ``queue`` holds; None if it does not exist (asked on a
        channel of its own: the broker closes the channel that asks of a missing queue)."""
        if self._probe is None:
            self._probe = self.connection.channel()
        try:
            return int(self._probe.queue_declare(queue, passive=True).message_count)
        except NotFound:
            self._probe = None
            return None
