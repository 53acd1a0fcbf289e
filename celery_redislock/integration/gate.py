"""Admission in the worker's main process, before the pool sees a request.

A run that finds no slot must be invisible to Celery's run semantics: no
``task_prerun``/``task_postrun``, no STARTED state, no pool process taken, nothing for
``revoke(terminate=True)`` to miss. So, as Celery's own ``rate_limit`` does in its
consumer (``celery/worker/strategy.py``), limited tasks are given a strategy that asks
their limits in the worker's main process, just before a request goes to the pool:

* a pool process is free for the run: its limits are asked (one script). Admitted, the
  lease (its slots, or the starts its rate limits gave it) goes to the pool process with
  the request (the request field :data:`~.execution.ADMITTED`); the pool process adopts
  it (one script: renewed, and described with its own process id), keeps it alive while
  the body runs and releases it at the end. A pool process lost before or after that
  has its slots freed by the main process, as before (see :mod:`.recovery`);
* no pool process is free: the request is held here, in one first-come first-served
  queue per worker, and asked about once a pool process is free (one timer looks at the
  worker's own state every :data:`~.execution.ROOM_POLL` seconds while the queue has
  requests, and takes as many from its head as there are free processes), so that a
  slot is never held by a run that waits for a process. A run that has waited
  :data:`PROBE_AFTER` has its limits *probed* (the same script, which takes nothing
  when it would admit the run): refused, it is refused as below, at once; else it waits
  on for a process. Short waits for a process (a pool running short tasks back to back)
  so cost no call to the lock store;
* refused: the run is sent back to wait (see :mod:`.waiting`), or ends as served by
  another copy of its message, or follows an earlier run of its task (see
  :func:`~.waiting.follow`), and its message is acknowledged, without ever reaching
  the pool. A rate limit's start promised within half a second is waited for here, the
  request held on the worker's timer (as Celery's ``rate_limit`` holds it), twice at
  the most;
* the lock store failed the main process: the run is sent back to wait for it, as its
  pool process would (fail-closed), and for 5 s the main process does not ask, so that
  its event loop never stalls on a store that does not answer; with
  ``redislock_fail_open`` the run goes to the pool, which runs it without a slot if it
  cannot ask either;
* a run that gave up waiting (``lock_max_wait``) goes to the pool, where its failure
  is stored as the task's (:func:`~.execution.run_limited`).

The copies of a waiting run's message (sent back, or sent when a slot was handed to it)
send no ``task-received`` event: the run was received once, when it was first sent.

    >>> from celery_redislock import LimitedTask
    >>> LimitedTask.Strategy
    'celery_redislock.integration.gate:limited_strategy'
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Deque, List, Tuple

from celery.exceptions import Ignore
from celery.worker import state as worker_state
from celery.worker.strategy import default as default_strategy

from ..config.settings import read_settings
from .execution import ADMITTED, PROMISED, ROOM_POLL, Later, admit_before_pool
from .handoff import WAIT_HEADER
from .recovery import forget_copy, limits_of

logger = logging.getLogger(__name__)

#: How many times a run is held for a rate limit's start in the main process before
#: it is sent back to the broker instead (as a pool process waits twice at the most).
SHORT_WAITS = 2


def limited_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """Celery's default strategy for ``task``, with admission before the pool (unless
    ``redislock_admit_before_pool`` is False: then the pool process asks)."""
    if not read_settings(app).admit_before_pool:
        return default_strategy(task, app, consumer, **options)
    gated = _GatedConsumer(consumer)
    handler = default_strategy(task, app, gated, **options)

    def task_message_handler(message: Any, *args: Any, **kwargs: Any) -> Any:
        headers = getattr(message, "headers", None) or {}
        gated.copy_of_a_wait = WAIT_HEADER in headers
        try:
            return handler(message, *args, **kwargs)
        finally:
            gated.copy_of_a_wait = False

    return task_message_handler


class _GatedConsumer:
    """The worker's consumer as Celery's default strategy sees it, with the requests it
    hands to the pool (directly, or after an ETA or countdown) passed through
    :func:`gate` first, and no ``task-received`` event for the copy of a waiting run's
    message. Everything else is the consumer's own."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        #: True while the strategy handles the copy of a waiting run's message.
        self.copy_of_a_wait = False
        handle = consumer.on_task_request
        self.on_task_request = lambda request: gate(consumer, request, handle)
        dispatcher = getattr(consumer, "event_dispatcher", None)
        self.event_dispatcher = None if dispatcher is None else _Events(dispatcher, self)

    def apply_eta_task(self, request: Any) -> None:
        worker_state.task_reserved(request)
        self.on_task_request(request)
        self._consumer.qos.decrement_eventually()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


class _Events:
    """The consumer's event dispatcher, less the ``task-received`` event of a copy."""

    def __init__(self, dispatcher: Any, gated: _GatedConsumer) -> None:
        self._dispatcher = dispatcher
        self._gated = gated

    def send(self, type: str, *args: Any, **fields: Any) -> Any:
        if type == "task-received" and self._gated.copy_of_a_wait:
            return None
        return self._dispatcher.send(type, *args, **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatcher, name)


#: How long (s) a run may wait in the main process for a free pool process before its
#: limits are probed (a run that would be refused is then sent back at once, instead of
#: waiting here for a process only to be refused): short waits, as when a pool runs
#: short tasks back to back, cost no call to the lock store.
PROBE_AFTER = 0.25


class _Hold:
    """What the main process knows of a request it holds back."""

    __slots__ = ("probed", "promises", "since", "waits")

    def __init__(self) -> None:
        self.promises: dict = {}
        self.waits = 0
        self.probed = False
        self.since = time.monotonic()

    def may_wait_unprobed(self) -> bool:
        """Whether, with no pool process free, the run waits for one without a probe."""
        return self.probed or time.monotonic() - self.since < PROBE_AFTER


#: Requests held back in the worker's main process (on its timer), which take no pool
#: process: they do not count when the gate looks for room. (The timer may be a thread of
#: its own, beside the consumer's: hence the lock.)
_held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_held_lock = threading.Lock()



class _Room:
    """A worker's requests held until a pool process is free for them (unasked, or
    probed and admissible), in the order they came; and whether the one timer that
    serves them is set."""

    __slots__ = ("queue", "timer_set")

    def __init__(self) -> None:
        self.queue: Deque[Tuple[Any, Callable[[Any], Any], _Hold]] = deque()
        self.timer_set = False


#: Each worker's (consumer's) queue of requests waiting for a free pool process.
_rooms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def gate(consumer: Any, request: Any, handle: Callable[[Any], Any]) -> Any:
    """Hand ``request`` to the pool (``handle``) once its limits admit it, or end it here
    (acknowledged, never run) when they do not, or hold it here for a while."""
    with _held_lock:
        hold = _held.pop(request, None)
    task = request.task
    limits = limits_of(task)
    if limits is None or request.revoked():
        return handle(request)
    room = _pool_has_room(consumer)
    hold = hold or _Hold()
    if not room and hold.may_wait_unprobed():
        return _wait_for_room(consumer, request, handle, hold)
    try:
        answer = admit_before_pool(task, limits, request._context, room=room,
                                   promises=hold.promises, may_wait=hold.waits < SHORT_WAITS)
    except Ignore:
        forget_copy(request)
        request.acknowledge()
        return None
    except Exception as exc:  # never lose a request: the pool process decides instead
        logger.warning("celery-redislock: task %s[%s]: could not ask its limits before the "
                       "pool (%r); the pool process asks", task.name, request.id, exc)
        answer = None
    if isinstance(answer, Later):
        hold.promises, hold.probed = dict(answer.promises), answer.probed
        if answer.probed:
            return _wait_for_room(consumer, request, handle, hold)
        hold.waits += 1
        return _hold_back(consumer, request, handle, hold, answer.seconds)
    if answer is not None:
        request.request_dict[ADMITTED] = answer
    elif hold.promises:
        request.request_dict[PROMISED] = hold.promises
    return handle(request)


def _hold_back(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: _Hold,
               seconds: float) -> None:
    """Ask about ``request`` again in ``seconds``; meanwhile it stays reserved by this
    worker (its message unacknowledged, as Celery's ``rate_limit`` holds a request)."""
    with _held_lock:
        _held[request] = hold
    consumer.timer.call_after(max(seconds, 0.001), _gate_again, (consumer, request, handle),
                              priority=6)


def _wait_for_room(consumer: Any, request: Any, handle: Callable[[Any], Any],
                   hold: _Hold) -> None:
    """Hold ``request`` at the end of its worker's queue of requests waiting for a free
    pool process, and set the timer that serves that queue."""
    with _held_lock:
        _held[request] = hold
        room = _rooms.get(consumer)
        if room is None:
            room = _rooms[consumer] = _Room()
        room.queue.append((request, handle, hold))
        if room.timer_set:
            return
        room.timer_set = True
    consumer.timer.call_after(ROOM_POLL, _serve_waiting_for_room, (consumer, room), priority=6)


def _serve_waiting_for_room(consumer: Any, room: _Room) -> None:
    """Gate again, from the head of the queue, as many held requests as there are free
    pool processes; come back in :data:`~.execution.ROOM_POLL` while any are left."""
    with _held_lock:
        free = _free_processes(consumer)
        taken = [room.queue.popleft() for _ in range(min(free, len(room.queue)))]
        taken += _due_for_a_probe(room)
    for request, handle, _ in taken:
        _gate_again(consumer, request, handle)
    with _held_lock:
        if not room.queue:
            room.timer_set = False
            return
    consumer.timer.call_after(ROOM_POLL, _serve_waiting_for_room, (consumer, room), priority=6)


def _due_for_a_probe(room: _Room) -> List[Tuple[Any, Callable[[Any], Any], _Hold]]:
    """Take out of ``room`` the requests that have waited :data:`PROBE_AFTER` unprobed
    (they are near its head: it is in order of arrival, the probed ones aside)."""
    due = []
    for waiting in room.queue:
        hold = waiting[2]
        if not hold.probed:
            if hold.may_wait_unprobed():
                break
            due.append(waiting)
    for waiting in due:
        room.queue.remove(waiting)
    return due


def _gate_again(consumer: Any, request: Any, handle: Callable[[Any], Any]) -> Any:
    """:func:`gate`, from the timer: a request held back is never dropped by an error
    (the pool process decides then)."""
    try:
        return gate(consumer, request, handle)
    except Exception as exc:
        logger.warning("celery-redislock: task %s[%s]: could not ask its limits before the "
                       "pool (%r); the pool process asks", request.task.name, request.id, exc)
        with _held_lock:
            _held.pop(request, None)
        return handle(request)


def _pool_has_room(consumer: Any) -> bool:
    """Whether a pool process is free to start the request being gated at once: a slot
    taken here is held until a pool process starts the run, so it is taken only then.
    The requests reserved by this worker, the gated one among them, are those in (or on
    their way to) the pool and those held back here. A pool that does not say how many
    processes it has is taken to have room (nothing would tell when it has)."""
    with _held_lock:
        return _free_processes(consumer) >= 0


def _free_processes(consumer: Any) -> int:
    """How many pool processes are free beyond the requests reserved by this worker and
    not held here (the one being gated among them, once taken out of the held ones);
    a large number for a pool that does not say how many processes it has. Called with
    the held requests' lock taken."""
    processes = getattr(consumer.pool, "num_processes", None) or 0
    if processes <= 0:
        return 1 << 30
    reserved = worker_state.reserved_requests
    held = sum(1 for request in _held if request in reserved)
    return processes - (len(reserved) - held)
