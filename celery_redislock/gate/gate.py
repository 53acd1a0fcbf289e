"""Admission in the worker's main process, before the pool sees a request.

A run that finds no slot must be invisible to Celery's run semantics: no
``task_prerun``/``task_postrun``, no STARTED state, no pool process taken, nothing for
``revoke(terminate=True)`` to miss. So, as Celery's own ``rate_limit`` does in its
consumer (``celery/worker/strategy.py``), limited tasks are given a strategy that asks
their limits in the worker's main process, just before a request goes to the pool:

* a pool process is free for the run: its limits are asked (one script). Admitted,
  the lease (its slots, or the starts its rate limits gave it) goes to the pool process
  with the request (the request field :data:`~.attempt.ADMITTED`); the pool process
  runs under it as it stands (and renews it should the run last a third of a lease),
  and this process gives it back when the pool reports the run's end (see
  :class:`_RunEnd`), with its next request to the lock store. On a worker with no
  event loop (gevent, eventlet) the pool process adopts the lease (one script: renewed,
  and described with its own process id) and releases it at the end. A pool process
  lost before or after that has its slots freed by the main process, as before (see
  :mod:`.recovery`);
* no pool process is free: the request is held here, in one first-come first-served
  queue per worker (:mod:`.room`), and asked about once a pool process is free, so
  that a slot is never held by a run that waits for a process. A run that has waited
  :data:`~.room.PROBE_AFTER` has its limits *probed* (the same script, which takes nothing
  when it would admit the run): refused, it is refused as below, at once; else it waits
  on for a process. Short waits for a process (a pool running short tasks back to back)
  so cost no call to the lock store;
* refused: the run is sent back to wait (see :mod:`.waiting`), or ends as served by
  another copy of its message, or follows an earlier run of its task (see
  :func:`~.waiting.follow`), and its message is acknowledged, without ever reaching
  the pool. A rate limit's start promised within half a second is waited for here, the
  request held on the worker's timer (as Celery's ``rate_limit`` holds it), twice at
  the most. When a rate limit is the run's only limit, that start is *booked* for it
  in the same call: held until then, the run goes to the pool without asking again,
  if a pool process is free and the start has not passed by more than
  :data:`BOOKED_SLACK`; else it gives the start back and asks anew;
* the lock store failed the main process: the run is sent back to wait for it, as its
  pool process would (fail-closed), and for 5 s the main process does not ask, so that
  its event loop never stalls on a store that does not answer (after a store's transient
  answer, ``READONLY`` or ``LOADING``, 0.5 s, then 1 s, one ask at a time); with
  ``redislock_fail_open`` the run goes to the pool, which runs it without a slot if it
  cannot ask either;
* a run that gave up waiting (``lock_max_wait``) goes to the pool, where its failure
  is stored as the task's (:func:`~.pool_process.run_limited`).

With ``redislock_gate = "async"`` (the default) the admission is not waited for: it is
sent on a connection the worker's event loop drives (:mod:`.hub_store`), and its reply,
or its failure (no reply within :data:`~.main_process.MAIN_PROCESS_TIMEOUT`: the store
failed, as above), comes back through :func:`_settle` to the same decision and actions.
An uncontended lease taken so is given back on that connection too.

The copies of a waiting run's message (sent back, or sent when a slot was handed to it)
send no ``task-received`` event: the run was received once, when it was first sent.

    >>> from celery_redislock import LimitedTask
    >>> LimitedTask.Strategy
    'celery_redislock.gate.gate:limited_strategy'
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Dict, Optional, Union

from celery.exceptions import Ignore
from celery.worker import state as worker_state
from celery.worker.strategy import default as default_strategy
from redis.exceptions import RedisError

from ..config.limit import TaskLimits
from ..config.settings import read_settings, redis_client
from ..engine.admission import Lease
from ..engine.refusal import describe_error
from ..line import handoff, moves, parked_deadline
from ..line.waiting import Parked
from ..pool.attempt import ADMITTED, MAIN_RELEASES, PROMISED
from ..pool.give_back import give_back_unstarted, release_for_pool
from ..run.limited import limits_of, task_settings
from ..run.waiting_run import carries_wait
from . import hand_on, kept_leases, room, standby, thin
from .hub_store import HubStore, hub_store
from .main_process import (
    MAIN_PROCESS_TIMEOUT,
    Asking,
    BeforePool,
    Later,
    ask_before_pool,
    end_unrun,
    park,
)
from .task_context import context_of, revoked

logger = logging.getLogger(__name__)

#: How many times a run is held for a rate limit's start in the main process before
#: it is sent back to the broker instead (as a pool process waits twice at the most).
SHORT_WAITS = 2


def limited_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """Celery's default strategy for ``task``, with admission before the pool (unless
    ``redislock_admit_before_pool`` is False: then the pool process asks)."""
    settings = read_settings(app)
    if not settings.admit_before_pool:  # the pool process asks (and parks: pool_park)
        return _claiming(app, default_strategy(task, app, consumer, **options))
    gated = _GatedConsumer(consumer)
    handler = default_strategy(task, app, gated, **options)

    def task_message_handler(message: Any, *args: Any, **kwargs: Any) -> Any:
        headers = getattr(message, "headers", None)
        if not carries_wait(headers):  # a newcomer, the common case: as Celery's own
            return handler(message, *args, **kwargs)
        moves.claim(app, headers)  # see _claiming
        gated.copy_of_a_wait = True
        try:
            return handler(message, *args, **kwargs)
        finally:
            gated.copy_of_a_wait = False

    return task_message_handler


def _claiming(app: Any, handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler``, with a moved copy's backup dropped once kombu holds the copy (see
    :func:`~..line.moves.claim`)."""

    def task_message_handler(message: Any, *args: Any, **kwargs: Any) -> Any:
        headers = getattr(message, "headers", None)
        if carries_wait(headers):
            moves.claim(app, headers)
        return handler(message, *args, **kwargs)

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
        self._handle = handle = consumer.on_task_request

        def on_task_request(request: Any) -> Any:
            # Called by the strategy as it handles the message, whose copy flag is known.
            return gate(consumer, request, handle, copy=self.copy_of_a_wait)

        self.on_task_request = on_task_request
        dispatcher = getattr(consumer, "event_dispatcher", None)
        self.event_dispatcher = None if dispatcher is None else _Events(dispatcher, self)

    def apply_eta_task(self, request: Any) -> None:
        worker_state.task_reserved(request)
        gate(self._consumer, request, self._handle)  # later: its copy flag read again
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


#: How late (s) a run held for a start booked for it may still go to the pool under it;
#: later (the worker's event loop was held up), it gives the start back and asks anew, so
#: that its start is never counted much earlier than it begins.
BOOKED_SLACK = 0.02


def gate(consumer: Any, request: Any, handle: Callable[[Any], Any],
         hold: Optional[room.Hold] = None, copy: Optional[bool] = None) -> Any:
    """Hand ``request`` to the pool (``handle``) once its limits admit it, or end it here
    (acknowledged, never run) when they do not, or hold it here for a while. ``hold``:
    what is known of a request gated again (None: gated for the first time; ``copy``:
    whether it is a copy of a waiting run's message, when known, else read from it)."""
    task = request.task
    # The limits a limited task's first run compiled (read at once; else compiled, or
    # its definition error raised, by limits_of).
    limits = task.__dict__.get("_redislock_limits") or limits_of(task)
    if hold is None:
        hold = room.hold_of(request, limits) if copy is None else room.Hold(copy, limits)
    if hold.booked is not None and limits is not None:
        booked = _due_booking(consumer, request, hold)
        if booked is not None:
            return _act_on_answer(consumer, request, handle, hold, limits, booked)
    if limits is None:
        return handle(request)
    loop = getattr(consumer, "hub", None) is not None
    # Not probed on the parking line (``loop``): its admission parks the run it refuses.
    where = room.place(consumer, request, handle, hold, loop, _gate_again)
    if where is None:  # it waits here for a free pool process (revoked: seen as it leaves)
        return None
    if revoked(request):
        return handle(request)
    go, ahead = where != room.PROBE, where == room.AHEAD
    if _hand_kept(consumer, request, handle, hold, go):
        return None
    slim = thin.thin_of(task, limits) if go else None
    if slim is not None and thin.ask(slim, consumer, request, handle, hold, ahead,
                                     hold.waits < SHORT_WAITS, _THIN):
        return None
    return _settle(consumer, request, handle, hold, limits, lambda: ask_before_pool(
        task, limits, context_of(request), room=go, promises=hold.promises,
        may_wait=hold.waits < SHORT_WAITS, loop=loop), ahead=ahead)


def _settle(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: room.Hold,
            limits: TaskLimits, step: Callable[[], Union[BeforePool, Asking]],
            ahead: bool = False) -> Any:
    """Act on the answer of ``step`` for ``request`` (see :func:`_act_on_answer`): an
    admission still to ask is asked blocking, or (``redislock_gate = "async"``) sent on
    the worker's event loop, whose reply comes back here, the same way, later. A run sent
    back or ended (``Ignore``) has its message acknowledged here. ``ahead``: the run is
    asked for before a pool process is free for it (see :func:`.room.lookahead`)."""
    try:
        answer = step()
        if isinstance(answer, Asking):
            store = _store_of(consumer, answer)
            call = None if store is None else standby.marked(consumer, request, answer.call())
            if store is None or call is None:
                answer = answer.blocking()
            else:
                asking, admit_call = answer, call
                store.run_script(call.script, call.keys, call.args, lambda reply: _settle(
                    consumer, request, handle, hold, limits,
                    lambda: asking.replied(admit_call, reply), ahead))
                return None
    except Ignore:
        room.spare[request.task.name] = False
        end_unrun(request)
        return None
    except Exception as exc:  # never lose a request: the pool process decides instead
        logger.warning("celery-redislock: task %s[%s]: could not ask its limits before the "
                       "pool (%r); the pool process asks", request.task.name, request.id, exc)
        answer = None
    return _act_on_answer(consumer, request, handle, hold, limits, answer, ahead)


def _store_of(consumer: Any, asking: Asking) -> Optional[HubStore]:
    """The connection on the worker's event loop to ask through; None: ask blocking."""
    if asking.attempt.setup.settings.gate != "async":
        return None
    return hub_store(consumer, asking.client, MAIN_PROCESS_TIMEOUT)


def _act_on_answer(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: room.Hold,
                   limits: TaskLimits, answer: BeforePool, ahead: bool = False) -> Any:
    """Hold ``request`` here for a while, or hand it to the pool with what its limits
    (``limits``) gave it (``answer``). Admitted ahead of a free pool process
    (``ahead``) where a line formed, or taking the last free slot, with still no
    process free: the slot is given back and the run waits here for a process."""
    to_spare = room.note_spare(consumer, request.task, limits, answer)
    if (ahead and isinstance(answer, dict) and not to_spare
            and not room.pool_has_room(consumer)
            and not revoked(request) and _give_back_ahead(consumer, request, answer)):
        return room.wait_for_room(consumer, request, handle, hold, _gate_again)
    if standby.hold_here(consumer, request, handle, answer, _STANDBY):
        return None
    if isinstance(answer, Parked):
        return park(consumer, request, answer)
    if isinstance(answer, parked_deadline.GaveUpHere):  # it fails in the pool process
        answer.mark(request)
        answer = None
    if isinstance(answer, Later):
        return _hold_for(consumer, request, handle, hold, answer)
    return _to_pool(consumer, request, handle, hold, limits, answer)


def _hold_for(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: room.Hold,
              later: Later) -> Any:
    """Hold ``request`` here as ``later`` says: until a pool process is free (probed),
    or for a start promised or booked soon."""
    hold.promises, hold.probed = dict(later.promises), later.probed
    if later.probed:
        return room.wait_for_room(consumer, request, handle, hold, _gate_again)
    hold.waits += 1
    hold.booked, hold.due = later.booked, time.monotonic() + later.seconds
    return room.hold_back(consumer, request, handle, hold, later.seconds, _gate_again)


def _to_pool(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: room.Hold,
             limits: TaskLimits, answer: Optional[Dict[str, Any]],
             handed_on: Optional[Callable[[], None]] = None) -> Any:
    """Hand ``request`` to the pool with the lease its limits gave it (``answer``; None:
    the pool process decides), to be given back here at its end where this process can;
    a run revoked while its limits were asked gives the lease back and ends.
    ``handed_on``: how the lease ``answer``, handed on to this run (see :func:`_hand_to`,
    whose caller looked at its revocation), is given back."""
    if handed_on is None and answer is not None and revoked(request):
        give_back_unstarted(request.task, limits, answer)
        return None
    release: Optional[Callable[[], None]] = handed_on
    if answer is not None:
        if release is None:
            release = _release_here(consumer, request, limits, answer)
        request.request_dict[ADMITTED] = answer if release is None else {
            **answer, MAIN_RELEASES: True}
    elif hold.promises:
        request.request_dict[PROMISED] = hold.promises
    _RunEnd(consumer, request, release, hold.copy)
    return handle(request)


def _give_back_ahead(consumer: Any, request: Any, handed: Dict[str, Any]) -> bool:
    """Give back, without waiting, the slot a run asked for ahead of a free pool
    process took (see :func:`.room.lookahead`); False when it cannot be so (the run then goes
    to the pool under it)."""
    settings = task_settings(request.task)
    store = hub_store(consumer, redis_client(request.task._get_app(), settings),
                      MAIN_PROCESS_TIMEOUT)
    return store is not None and store.give_back(
        handed, functools.partial(handoff.publish, request.task.app))


def _due_booking(consumer: Any, request: Any, hold: room.Hold) -> Optional[Dict[str, Any]]:
    """The lease of the start booked for ``request`` (see :class:`Booked`), now due, to
    hand to the pool with it: a pool process is free, and the start has not passed by
    more than :data:`BOOKED_SLACK`. Else (and for a revoked run) the start is given
    back, and None answered: the run asks anew."""
    booked, hold.booked = hold.booked, None
    assert booked is not None
    if (time.monotonic() <= hold.due + BOOKED_SLACK and not revoked(request)
            and room.pool_has_room(consumer)):
        return booked.lease.handover()
    try:
        booked.give_back()
    except RedisError as exc:
        logger.warning("celery-redislock: task %s[%s]: could not give back the start booked "
                       "for it (%s)", request.task.name, request.id, describe_error(exc))
    return None


def _release_here(consumer: Any, request: Any, limits: TaskLimits,
                  handed: Dict[str, Any]) -> Optional[Callable[[], None]]:
    """How the worker's main process gives back the slots it was admitted to for
    ``request`` once the run ends (with its next request to the lock store); None when
    the pool process is to: a worker with no event loop (gevent, eventlet), no slots, a
    lease in several parts (Redis Cluster), or a contended one (a line had formed, or
    the run took the last free slot: someone is likely to wait for this release, which
    the pool process sends the moment the body ends, before the result goes back to
    this process)."""
    if getattr(consumer, "hub", None) is None or not handed.get("keys") or handed.get("parts"):
        return None
    if handed.get("contended") or handed.get("last"):  # to a standby here, if any
        return standby.release_for(consumer, request, limits, handed, _STANDBY)
    settings = task_settings(request.task)
    if settings.gate == "async":
        store = hub_store(consumer, redis_client(request.task._get_app(), settings),
                          MAIN_PROCESS_TIMEOUT)
        release: Optional[Callable[[], None]] = None if store is None else functools.partial(
            _release_on_hub, store, request.task, limits, handed)
    else:
        release = functools.partial(release_for_pool, request.task, limits, handed)
    if release is None or not settings.hand_on:
        return release
    return hand_on.MainRelease(handed, limits, release)


def _release_on_hub(store: HubStore, task: Any, limits: TaskLimits,
                    handed: Dict[str, Any]) -> None:
    """Give back, on the worker's event loop, the lease ``handed`` to a run that ended
    (read from the record where it can be: :meth:`~.hub_store.HubStore.release_record`)."""
    publish = functools.partial(handoff.publish, task.app)
    if store.release_record(handed, publish):
        return
    if not store.release(Lease.of_handover(store.client, handed), publish):
        release_for_pool(task, limits, handed)


class _RunEnd:
    """The wrappers of a request's ``on_success`` and ``on_failure``, put on it as it is
    made (as bound methods of one object, not closures that refer to each other: such
    closures are a reference cycle through the request, which only Python's garbage
    collector frees).

    They have the end of ``request``'s run, as the worker's main process learns of it,
    give back the slots the main process took for it (``release``), and serve the
    requests waiting for a free pool process at once, instead of leaving the process
    it frees idle until the queue's timer.

    Only the end of a run whose body has ended gives the slots back here: its result
    (``on_success``, whatever the task's state) or a failure the trace returned
    (``on_failure`` with ``return_ok``). A pool process lost, or killed at a hard time
    limit or by a terminating revoke (its body may still run for a moment), has its
    slots freed by :mod:`.recovery` once the process is gone.

    The wrappers are taken off the request once the run's end is handled: they refer to
    the request (its own methods), which would otherwise refer to them, a cycle that
    only Python's garbage collector frees (every request and its message kept until a
    collection, and collections run far more often: about 45 µs of the worker's main
    process per run at 400 runs/s). The pool keeps the wrappers it was handed until it
    calls one of them. ``copy``: the request is a copy of a waiting run's message (its
    slots are never handed on, see :func:`_hand_on`)."""

    __slots__ = ("consumer", "copy", "ended_badly", "ended_well", "release", "request")

    def __init__(self, consumer: Any, request: Any, release: Optional[Callable[[], None]],
                 copy: bool = False) -> None:
        self.consumer, self.request, self.release, self.copy = consumer, request, release, copy
        self.ended_well, self.ended_badly = request.on_success, request.on_failure
        try:
            request.on_success, request.on_failure = self.succeeded, self.failed
        except AttributeError:  # a request class with __slots__ only: the timer serves
            if release is not None:
                request.request_dict[ADMITTED].pop(MAIN_RELEASES, None)

    def give_back(self) -> bool:
        """Give the run's slots back, or hand them on to the next run waiting here for a
        pool process, or keep them a moment for the next run to come (see
        :mod:`.hand_on`; never the slots of a copy of a waiting run's message: they go
        back through the store). True: handed on (the run at the head of the queue
        took the process this run freed)."""
        release, self.release = self.release, None
        if release is None:
            return False
        if self.copy:
            release()
            return False
        # The lease may be handed on (hand_on.MainRelease.fresh, read here: this runs
        # once a run).
        if type(release) is not hand_on.MainRelease:
            release()
            return False
        now = time.monotonic()
        if now < release.until and _hand_on(self.consumer, release):
            return True
        if not kept_leases.keep(self.consumer, release, now):
            release()
        return False

    def unwrap(self) -> None:
        """Take the wrappers off the request: the run's end is handled (the pool keeps
        the ones it was handed until it calls one)."""
        hand_on.forget(self.request.id)
        own = getattr(self.request, "__dict__", None)
        if own is None:
            return
        # Read without getattr (this runs once a run): each wrapper still there is ours.
        try:
            if own["on_success"].__self__ is self:
                del own["on_success"]
        except (KeyError, AttributeError):  # not there, or not a bound method
            pass
        try:
            if own["on_failure"].__self__ is self:
                del own["on_failure"]
        except (KeyError, AttributeError):
            pass

    def succeeded(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.ended_well(*args, **kwargs)
        finally:
            handed_on = self.give_back()
            self.unwrap()
            if not handed_on:  # else the queue was served: see _hand_on
                room.serve_now(self.consumer, _gate_again)

    def failed(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.ended_badly(*args, **kwargs)
        finally:
            handed_on = bool(kwargs.get("return_ok")) and self.give_back()
            self.unwrap()
            if not handed_on:
                room.serve_now(self.consumer, _gate_again)


def _hand_on(consumer: Any, release: hand_on.MainRelease) -> bool:
    """Hand the lease of a run that ended (its ``release``, young enough to be handed on;
    not a copy of a waiting run's message, whose slots go back through the store) to the
    run at the head of ``consumer``'s queue of runs waiting for a pool process, when that
    run is of the same limits and may go to the pool now (see :mod:`.hand_on`): it goes
    to the pool under it, and True is answered. Else False: the caller gives the lease
    back.

    A hand-on serves the queue as :func:`.room.serve_now` would: the process this run
    freed takes the head, and every other process freed by the end of a run gated here
    served the queue as it freed (one freed otherwise, by a plain task's end or a lost
    process, is the queue's timer's, as before), so the caller serves no more."""
    head = room.head_for_hand_on(consumer, release.limits)
    if head is None:
        return False
    request, handle, hold = head
    if revoked(request):
        release()
        handle(request)
        room.serve_now(consumer, _gate_again)  # the process is still free
        return True
    return _hand_to(consumer, request, handle, hold, release)


def _hand_kept(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: room.Hold,
               go: bool) -> bool:
    """Hand ``request`` (not revoked), which may ``go`` to the pool now (or ahead), the
    lease of a run that ended here a moment ago, kept for the next run of its limits
    (see :func:`.kept_leases.keep`): True. False: none is kept for it, and it asks."""
    kept = kept_leases.take(consumer, hold) if go else None
    return kept is not None and _hand_to(consumer, request, handle, hold, kept)


def _hand_to(consumer: Any, request: Any, handle: Callable[[Any], Any], hold: room.Hold,
             release: hand_on.MainRelease) -> bool:
    """Hand ``request`` (not revoked) to the pool under the lease of a run that ended
    (its ``release``), given back at its end by the same call with the lease's new
    record (see :func:`_release_here`)."""
    handed, handed_on = release.pass_on(request.id)
    _to_pool(consumer, request, handle, hold, release.limits, handed, handed_on=handed_on)
    return True


def _gate_again(consumer: Any, request: Any, handle: Callable[[Any], Any]) -> Any:
    """:func:`gate`, from the timer: a request held back is never dropped by an error
    (the pool process decides then)."""
    try:
        return gate(consumer, request, handle, room.unhold(request))
    except Exception as exc:
        logger.warning("celery-redislock: task %s[%s]: could not ask its limits before the "
                       "pool (%r); the pool process asks", request.task.name, request.id, exc)
        room.unhold(request)
        return handle(request)


def _standby_to_pool(consumer: Any, request: Any, handle: Callable[[Any], Any],
                     handed: Dict[str, Any]) -> Any:
    """Send ``request``, a standby (not revoked), to the pool under the lease ``handed``
    of a run that ended here (see :mod:`.standby`)."""
    limits = limits_of(request.task)
    assert limits is not None
    hold = room.unhold(request) or room.hold_of(request, limits)
    release = standby.release_for(consumer, request, limits, handed, _STANDBY)
    return _to_pool(consumer, request, handle, hold, limits, handed, handed_on=release)


def _ask_now(consumer: Any, request: Any, handle: Callable[[Any], Any]) -> Any:
    """Ask about ``request`` at once, a pool process being free for it (a standby taking
    the slot of a run that ended here, see :mod:`.standby`), not after the runs waiting
    here for a process."""
    limits = limits_of(request.task)
    assert limits is not None
    hold = room.unhold(request) or room.hold_of(request, limits)
    return _settle(consumer, request, handle, hold, limits, lambda: ask_before_pool(
        request.task, limits, context_of(request), room=True, promises=hold.promises,
        may_wait=hold.waits < SHORT_WAITS, loop=True))


#: What the gate lends :mod:`.thin`.
_THIN = thin.Gate(_act_on_answer, _settle)

#: What the gate lends :mod:`.standby`.
_STANDBY = standby.Gate(_gate_again, _standby_to_pool, _ask_now)
