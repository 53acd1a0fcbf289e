"""The worker's main process's interpreter of a run's admission: before the pool sees a
request, the one place that carries out :func:`~.decide.decide`'s action there.

:func:`ask_before_pool` makes the run's :class:`~.attempt.Attempt`; :class:`Asking`
asks the lock store (blocking, or on the worker's event loop: the gate sends the call
and hands back the reply) and carries the decision out: a lease to hand to the pool
process, a hold (:class:`Later`), a park (:class:`~.waiting.Parked`: the gate publishes
the copy, then acknowledges the original), a run that gave up waiting (it fails in the
pool), or the end of this copy (``Ignore``: sent back to wait, served already, or
following an earlier run of its task), after which the gate acknowledges its message
(:func:`end_unrun`). :func:`park` publishes a parked run's copy (on the mover's thread)
and acknowledges the original once it is in its parking queue, never before.
Nothing here blocks for longer than :data:`MAIN_PROCESS_TIMEOUT`, and after a failure
of the lock store the main process asks no more for a while (:class:`_Pause`).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from celery.exceptions import Ignore
from redis.exceptions import RedisError

from ..config.limit import TaskLimits
from ..engine.admission import AdmitCall, Booked, Outcome, prepare_admit
from ..engine.channel import limit_waits
from ..engine.parking import GaveUp, ParkAdmitCall
from ..engine.refusal import error_kind, is_transient
from ..errors import LockWaitTimeout
from ..line import broker_line, moves, parked_deadline
from ..line.waiting import Parked, parked, requeue, served
from ..pool import pool_park
from ..pool.attempt import Attempt, Setup, limit_names, outcome_time, short_wait_of
from ..pool.earlier_run import follows_on, look_at_earlier
from ..pool.store_errors import report_store_error
from ..run.decide import Action, End, Hold, Park, Run, SendBack, Situation, decide
from .recovery import forget_copy

logger = logging.getLogger(__name__)


#: After the lock store could not be reached by the worker's main process, how long (s)
#: it asks no more: runs are held as if the store had failed them (parking line:
#: :data:`STORE_HOLD`; a run that cannot park is sent back to wait), or, with
#: ``redislock_fail_open``, go to the pool. (A store that does not answer costs the
#: blocking gate up to :data:`MAIN_PROCESS_TIMEOUT` of its event loop per ask.)
MAIN_PROCESS_PAUSE_AFTER_ERROR = 5.0

#: After the lock store answered with a transient error (``READONLY`` during a
#: fail-over, ``LOADING``), the longest pause (s) between the main process's asks: it
#: answered at once, so asking costs no stall; the pause starts at :data:`STORE_HOLD`
#: and doubles with each ask that fails, up to this.
PAUSE_AFTER_ANSWERED_ERROR = 1.0


class _Pause:
    """When the worker's main process may ask the lock store, after a transient error:
    not before ``until``; then one ask at a time (a probe: the others are held until its
    answer, or until it is overdue), with the pause after each failed probe doubled (see
    :data:`PAUSE_AFTER_ANSWERED_ERROR`, :data:`MAIN_PROCESS_PAUSE_AFTER_ERROR`).

        >>> pause = _Pause()
        >>> pause.failed("readonly", now=0.0); pause.asks(now=0.4), pause.asks(now=0.5)
        (False, True)
        >>> pause.asks(now=0.6)  # the probe is in flight
        False
        >>> pause.failed("readonly", now=0.6); round(pause.until, 2)
        1.55
        >>> pause.answered(); pause.asks(now=0.7)
        True
    """

    __slots__ = ("interval", "until")

    def __init__(self) -> None:
        self.until = float("-inf")
        #: The pause after the next failure; 0: the store answered since the last one.
        self.interval = 0.0

    def asks(self, now: float) -> bool:
        """Whether an ask may go now (after an error, it is the probe)."""
        if now < self.until:
            return False
        if self.interval:
            self.until = now + 2 * MAIN_PROCESS_TIMEOUT  # the probe's answer is due by then
            self.interval = min(2 * self.interval, PAUSE_AFTER_ANSWERED_ERROR)
        return True

    def failed(self, kind: str, now: float) -> None:
        """A transient error of ``kind`` (see :func:`~..engine.refusal.error_kind`)."""
        self.interval = self.interval or STORE_HOLD
        # Ends a little early: the held runs' timers (every STORE_HOLD) that fall due as
        # it ends may fire a few ms early, and would wait for the next tick.
        self.until = now - 0.05 + (MAIN_PROCESS_PAUSE_AFTER_ERROR if kind == "unreachable"
                                   else self.interval)

    def answered(self) -> None:
        """The lock store answered: ask as before."""
        self.until, self.interval = float("-inf"), 0.0


_pause = _Pause()


#: How long (s) the worker's main process waits for the lock store (to connect, or for
#: an answer) before it counts it failed (a plain ``redis.Redis`` client only).
MAIN_PROCESS_TIMEOUT = 1.0


@dataclass(frozen=True)
class Later:
    """What :func:`ask_before_pool` answers for a run to be held in the worker's main
    process and asked about again after ``seconds``: a rate limiter promised it a start
    that close (``promises``, to ask with), or (``probed``) it would be admitted but no
    pool process is free for it; or held until then and started without asking again,
    under the start its rate limiter booked for it (``booked``)."""

    seconds: float
    promises: Dict[str, int]
    probed: bool = False
    booked: Optional[Booked] = None


#: The answer of :func:`ask_before_pool`: the lease to adopt, a hold, a run to park
#: (:class:`~.waiting.Parked`), a run that gave up waiting, or None.
BeforePool = Union[None, Dict[str, Any], Later, "Parked", parked_deadline.GaveUpHere]


def ask_before_pool(task: Any, limits: TaskLimits, request: Any, *, room: bool = True,
                    promises: Optional[Mapping[str, int]] = None,
                    may_wait: bool = True, loop: bool = False) -> Union[BeforePool, Asking]:
    """Decide in the worker's main process, before the pool sees the request, whether
    this run may start. ``request`` is the task's context (``args``, ``kwargs``,
    ``headers``, ``delivery_info``...), as the pool process would see it; ``room``: a
    pool process is free to start it at once; ``loop``: the worker has an event loop (a
    refused run may then wait on the parking line).

    Answers the :class:`Asking` that asks the store (blocking, or sent by the caller,
    which hands it the reply: the worker's event loop, see :mod:`.hub_store`), or, when
    the answer needs no store (the package is disabled, the main process asks no store
    for a while after a failure), the answer itself (:data:`BeforePool`):

    * admitted (``room`` only): what the pool process is to adopt
      (:meth:`Lease.handover`: the slots, or the rate limits' starts, taken here);
    * ``Ignore``: the run ends here (sent back to wait, served by another copy,
      following an earlier run; the lock store failed and it is sent back to wait for
      it), after which the caller acknowledges the message without running it;
    * :class:`Later`: hold the request here and ask again then (a rate limiter's start
      within :func:`~.attempt.short_wait_of`, at most when ``may_wait``; or no room for
      a run that the limits would admit: a probe, which takes nothing, found it so); or,
      when the run's one limiter is a rate limiter, hold it until the start booked for
      it then (:class:`~..engine.admission.Booked`) and start it without asking again;
    * :class:`~.waiting.Parked`: publish its copy to its parking queue, then acknowledge;
    * None: the pool process is to decide as before (the package is disabled, the run
      gave up waiting: its failure belongs in the task's trace; ``redislock_fail_open``
      and the lock store failed).
    """
    if not limits.rules:
        return None
    if not Setup.of(task, limits).settings.enabled:
        return None
    asking = asking_of(task, limits, request, room=room, promises=promises,
                       may_wait=may_wait, loop=loop)
    if asking is None:
        return None  # no event loop: it parks in the process (greenlet) that runs it
    attempt, args, kwargs = asking.attempt, asking.args, asking.kwargs
    if not _pause.asks(time.monotonic()):
        return _without_store(attempt, args, kwargs, None)
    try:
        if attempt.waited.follows and follows_on(attempt, args, kwargs):
            raise Ignore()  # it went back to follow the earlier run, or that run ended
    except RedisError as exc:
        return asking.failed(exc)
    except LockWaitTimeout:
        return None
    return asking


def asking_of(task: Any, limits: TaskLimits, request: Any, *, room: bool,
              promises: Optional[Mapping[str, int]], may_wait: bool,
              loop: bool) -> Optional[Asking]:
    """The :class:`Asking` of ``request`` (a task's context) under ``limits`` (an
    enabled task's, with rules), as :func:`ask_before_pool` asks it; None when the run
    parks in the process that runs it (no event loop, see :mod:`~..pool.pool_park`).
    It does not look at the pause after a failure of the store (see
    :func:`store_asked`)."""
    setup = Setup.of(task, limits)
    args, kwargs = tuple(request.args or ()), dict(request.kwargs or {})
    attempt = Attempt.of(task, setup, args, kwargs, request, pid=None)  # unadopted
    attempt.promises.update(promises or {})
    if not loop and pool_park.parks_here(setup.settings, setup.client, attempt.limiters):
        return None
    attempt.parking = setup.parks(attempt.limiters, loop, task.name)
    return Asking(attempt, args, kwargs, room, may_wait)


def store_asked() -> bool:
    """Whether the worker's main process may ask the lock store now (not paused after a
    failure of the store: see :class:`_Pause`); if so, the ask is counted as sent (the
    probe, after a failure)."""
    return _pause.asks(time.monotonic())


def store_answered() -> None:
    """The lock store answered an ask of the main process: it is asked as before."""
    _pause.answered()


@dataclass
class Asking:
    """One run's admission in the worker's main process, between the question and the
    answer: :meth:`blocking` asks and answers; or the caller sends :meth:`call` itself
    and hands the reply to :meth:`replied` (or the failure to :meth:`failed`). Either way
    the outcome goes through :func:`decide` and is carried out by :meth:`answered`."""

    attempt: Attempt
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    room: bool
    may_wait: bool

    def __post_init__(self) -> None:
        request = self.attempt.request
        self.short_wait = short_wait_of(self.attempt.task, request)
        self.redelivered = bool((request.delivery_info or {}).get("redelivered"))
        self.probe = not self.room
        self.book_ms = (int(self.short_wait * 1000)
                        if self.room and self.may_wait and not self.redelivered else 0)

    @property
    def client(self) -> Any:
        """The lock store's client (its connection settings, its scripts' state)."""
        return self.attempt.setup.client

    def blocking(self) -> BeforePool:
        """Ask the lock store, waiting at most :data:`MAIN_PROCESS_TIMEOUT`."""
        limit_waits(self.client, MAIN_PROCESS_TIMEOUT)
        try:
            outcome = self._admit()
        except RedisError as exc:
            return self.failed(exc)
        except LockWaitTimeout:
            return None
        return self.answered(outcome)

    def _admit(self) -> Outcome:
        """The admission, blocking (the hand-offs it brings published)."""
        call = self.call() if self.attempt.parking else None
        if call is None:
            return self.attempt.admit(probe=self.probe, book_ms=self.book_ms)
        return self.attempt.published(call.outcome(
            call.script.run(self.client, call.keys, call.args)))

    def call(self) -> Optional[Union[AdmitCall, ParkAdmitCall]]:
        """The one script call of the admission, for a caller that sends it itself; None
        when it takes more than one (Redis Cluster): :meth:`blocking` then."""
        attempt = self.attempt
        if attempt.parking:
            return broker_line.prepare(self.client, attempt.limiters,
                                       attempt.park_ask(self.book_ms))
        return prepare_admit(
            self.client, attempt.limiters, lease=attempt.setup.limits.lease,
            description=attempt.description, promises=attempt.promises,
            owner=attempt.owner, reserve_ms=attempt.reserve_ms,
            probe=self.probe, book_ms=self.book_ms)

    def replied(self, call: Union[AdmitCall, ParkAdmitCall], reply: Any) -> BeforePool:
        """The answer for the lock store's ``reply`` to ``call`` (a failure of the
        connection as a ``RedisError``)."""
        if isinstance(reply, RedisError):
            return self.failed(reply)
        return self.answered(self.attempt.published(call.outcome(reply)))

    def answered(self, outcome: Any) -> BeforePool:
        """Decide on ``outcome`` and carry the decision out (see
        :func:`ask_before_pool`)."""
        _pause.answered()
        try:
            return _ask_before_pool(self.attempt, self.args, self.kwargs, outcome,
                                    self.may_wait, self.short_wait, self.redelivered)
        except RedisError as exc:
            return self.failed(exc)
        except LockWaitTimeout:
            return None

    def failed(self, exc: RedisError) -> BeforePool:
        """The lock store failed the main process: the run is held, or sent back to
        wait for it (see :func:`_without_store`); after a transient error the store is
        not asked again for a while (:class:`_Pause`)."""
        if is_transient(exc):
            # The worker's main process must not wait on a lock store that does not
            # answer (a connect timeout stalls the blocking gate's event loop): for
            # MAIN_PROCESS_PAUSE_AFTER_ERROR it asks no more; one that answered (READONLY,
            # LOADING) is asked again sooner, one ask at a time.
            _pause.failed(error_kind(exc), time.monotonic())
        else:
            _pause.answered()
        return _without_store(self.attempt, self.args, self.kwargs, exc)


def _ask_before_pool(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
                     outcome: Any, may_wait: bool, short_wait: float,
                     redelivered: bool) -> BeforePool:
    """The answer of :func:`ask_before_pool` for the lock store's ``outcome``."""
    if isinstance(outcome, GaveUp):  # parked past its max wait: it fails in the pool
        return parked_deadline.gave_up(attempt.task, attempt.request, outcome,
                                       attempt.setup.limits.retry.max_wait)
    action = decide(outcome, Situation(may_hold=may_wait, short_wait=short_wait,
                                       redelivered=redelivered))
    if isinstance(action, Park):
        return parked(attempt.task, attempt.request, attempt.waited, action,
                      outcome_time(outcome))
    if not isinstance(action, Hold):
        return _carry_out(attempt, args, kwargs, outcome, action)
    if action.look_for_earlier and look_at_earlier(attempt, args, kwargs, outcome):
        raise Ignore()  # sent back to follow the earlier run of its task
    if action.promise is not None:
        attempt.promises[action.promise[0]] = action.promise[1]
    return Later(action.seconds, attempt.promises, probed=action.probed,
                 booked=action.booked)


def _carry_out(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
               outcome: Any, action: Action) -> Dict[str, Any]:
    """Do what :func:`decide` chose, other than a hold or a park: the lease for the pool
    process to adopt (:meth:`~..engine.admission.Lease.handover`), or the run ends here
    (``Ignore``: served already, sent back to wait, or sent back to follow the earlier
    run of its task); the gate then acknowledges its message."""
    task, request = attempt.task, attempt.request
    if isinstance(action, End):
        served(task, request, action.name)
        raise Ignore()
    assert isinstance(action, (Run, SendBack))  # the main process never runs eager runs
    if action.look_for_earlier and look_at_earlier(attempt, args, kwargs, outcome):
        raise Ignore()
    if isinstance(action, Run):
        return action.lease.handover()
    requeue(task, request, args, kwargs, attempt.setup.limits.retry, action.refusal)
    raise Ignore()


def _without_store(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
                   exc: Optional[RedisError]) -> BeforePool:
    """The worker's main process could not ask the lock store (``exc``; None: it asks
    no more for a while, after a failure): the run is sent back to wait (``Ignore``), as
    its pool process would send it back, fail-closed (on the parking line it is held
    here, :data:`STORE_HOLD`); with ``redislock_fail_open`` and an outage, it goes to
    the pool (None), which runs it without a slot if it cannot ask either."""
    task, request = attempt.task, attempt.request
    if attempt.setup.settings.fail_open and (exc is None or is_transient(exc)):
        return None
    if exc is not None:
        report_store_error(task, request.id, limit_names(attempt.limiters), exc)
    if attempt.parking:  # one copy: held here, never re-published (its header kept)
        if exc is not None and error_kind(exc) == "unreachable":  # else said above
            logger.info("celery-redislock: task %s[%s] held: it could not reach the lock "
                        "store; it asks again in %.2f s", task.name, request.id, STORE_HOLD)
        return Later(STORE_HOLD, attempt.promises)
    requeue(task, request, args, kwargs, attempt.setup.limits.retry, None)
    raise Ignore()


#: The parking line: how long (s) the worker's main process holds a run the lock store
#: did not answer for before it asks again (the run stays one message, unacknowledged
#: here, instead of a copy sent back with a countdown: a copy published and the original
#: acknowledged is a window no reference tells apart).
STORE_HOLD = 0.5


def end_unrun(request: Any) -> None:
    """Acknowledge ``request``, which ends here without running (sent back to wait,
    parked, or served by another copy): the last step of its message in this worker."""
    forget_copy(request)
    request.acknowledge()


def park(consumer: Any, request: Any, parked: Parked) -> None:
    """Publish ``request``'s parked copy on the mover's thread; the original is
    acknowledged on the event loop once the copy is in its parking queue, never before
    (a worker that dies between the two: the broker gives the original back, and its
    reference tells it apart). Not published: the original goes back to its queue."""
    forget_copy(request)
    published = moves.hop(consumer.hub).on_loop(  # from the mover's thread
        functools.partial(_after_park, request, parked))
    if not moves.park(request.task.app, request.message, parked.ref, parked.wait,
                            published):
        _not_parked(request, parked, "the mover is full or stopped")


def _after_park(request: Any, parked: Parked, done: Any) -> None:
    """On the event loop, after the mover's publish of ``request``'s parked copy."""
    if done.ok:
        end_unrun(request)
    else:
        _not_parked(request, parked, repr(done.error or done.outcome))


def _not_parked(request: Any, parked: Parked, why: str) -> None:
    """The parked copy was not published: the original goes back to its queue (one
    broker operation), to ask again; its reference names it anew then."""
    logger.warning("celery-redislock: task %s[%s] could not be parked behind %r (%s); it "
                   "goes back to its queue", request.task.name, request.id, parked.name, why)
    request.reject(requeue=True)
