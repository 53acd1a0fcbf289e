"""The broker side of the parking line (``redislock_line = "broker"``, the default and
only line).

A run refused by a semaphore waits as ONE message in its key's *parking queue*, a
queue of the broker that no worker consumes; the lock store keeps only references
(see :mod:`celery_redislock.engine.parking`). When the store hands the line a slot, one
message is moved back to the queue its task is consumed from, to the front where the
transport allows it (Redis broker), so that the waiter runs next.

The contract, for the main process's gate and the poll:

* :func:`parking_queue` (``naming``): ``semaphore_key -> queue name``, short and
  deterministic (``redislock.parking.<24 hex>``); a fair line (``fair_by``) has one
  parking queue per sub-line, named by ``line_name(key, sub)``.
* :class:`ParkedCopy` (``parked_copy``): ``ParkedCopy.of(message, key, wait)`` reads
  the kombu message a worker received (no network): body, content type and encoding,
  headers with ``redislock_wait`` replaced by ``wait``, the properties Celery reads
  (priority...), and its :class:`Route` (the exchange and routing key it was delivered
  with). The moved copy keeps that route as its ``delivery_info``, so ``self.retry()``
  and routing behave as for the original. ``moved_copy(headers, attempt)``: whether a
  message is a copy moved back, or a later attempt that inherited the parked copy's
  headers through ``self.retry()`` (Celery copies custom headers into a retry: the
  retry carries the old ``redislock_wait`` with its park id, which must not count).
* :class:`ParkingBroker` (``broker``): the operations on one broker connection,
  blocking (use them from a thread, never from the event loop):
  ``park(copy, job_id) -> Outcome``, ``move(parking_queue, job_id) -> Outcome``
  (``done`` False: the parking queue was empty, or its head had nowhere to go and was
  set aside: the caller gives the reservation back), ``lengths(queues) -> {queue: n}``,
  ``registry(max_age) -> {queue: semaphore key}``, ``claimed(move id) -> bool`` (a
  worker received that moved copy: its backup is dropped) and ``restore() -> Restored`` (the
  backups of moved copies no worker received in time put back at the front of their
  parking queues, and the copies still queued, late; Redis broker only: see
  :mod:`.redis_line`; RabbitMQ keeps none, having no pop window). ``broker_for(connection)``
  (``transport``; one per connection) picks :class:`RedisParking` (every step one Lua
  script on the broker's Redis, exactly once even when retried; moved to the front of
  the queue's list for its priority) or :class:`AmqpParking` (RabbitMQ: mandatory
  publishes with confirms; move = get, publish, ack; moved to the back).
* ``lengths``: ``parked_lengths(broker, keys) -> {semaphore key: n}`` (what the
  store's ``due()`` takes) and ``recount(broker) -> {semaphore key: n}`` (every line the
  broker's registry knows that holds messages: after the store lost its data).
* :class:`ParkingQueues` (``queues``): the lengths of an app's parking queues over one
  broker connection, for the views (``None`` and an ``error`` when the broker cannot be
  asked).
* :class:`Mover` (``mover``): one thread per worker process with its own broker
  connection, jobs done in order, ``park(copy, on_done)`` / ``move(queue, on_done)``
  (and ``claim(move id, on_done)``) return False at once when its bounded queue is full
  or it stopped; ``on_done(Done)``
  is called on the mover's thread; the main process passes ``LoopHop(hub).on_loop(cb)``
  (``hop``), which runs ``cb(done)`` on the event loop with any kombu version
  (``hub.call_soon`` is thread-safe only since kombu 5.7). A Mover's thread does not
  survive a fork: start it in the process that uses it (prefork: the main process, or
  each pool process after the fork).

May import: the standard library, ``kombu``, ``amqp`` and ``redis`` (the broker's own
clients) and ``celery_redislock.errors``; never Celery, the engine or the integration
(``tests/test_layers.py`` checks this). The lock store's side of the line is
:mod:`celery_redislock.engine.parking`; the integration joins the two.
"""

from .amqp_line import AmqpParking
from .broker import Outcome, ParkingBroker, Restored
from .hop import LoopHop
from .lengths import parked_lengths, recount
from .mover import Done, Mover
from .naming import (
    PARKING_PREFIX,
    REGISTRY,
    ROUTE_HEADER,
    is_parking_queue,
    key_of_line,
    line_name,
    parking_queue,
)
from .parked_copy import ParkedCopy, Route, moved_copy
from .queues import ParkingQueues
from .redis_line import RedisParking
from .transport import broker_for

__all__ = [
    "PARKING_PREFIX",
    "REGISTRY",
    "ROUTE_HEADER",
    "AmqpParking",
    "Done",
    "LoopHop",
    "Mover",
    "Outcome",
    "ParkedCopy",
    "ParkingBroker",
    "ParkingQueues",
    "RedisParking",
    "Restored",
    "Route",
    "broker_for",
    "is_parking_queue",
    "key_of_line",
    "line_name",
    "moved_copy",
    "parked_lengths",
    "parking_queue",
    "recount",
]
