"""Running one task under its limits: admit, run the body, give the slots back.

Shared by :class:`~celery_redislock.LimitedTask` and by plain tasks limited through the
``redislock_limits`` setting (see :mod:`celery_redislock.integration.install`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from celery.exceptions import Ignore
from celery.signals import worker_process_shutdown, worker_shutdown
from redis.exceptions import RedisError

from ..config.limit import TaskLimits
from ..config.settings import Settings, read_settings, redis_client
from ..engine.admission import (
    FREED_AS_LOST,
    AdmitCall,
    Booked,
    Busy,
    Lease,
    Outcome,
    Paused,
    RateLimited,
    SlotLimit,
    admit,
    declare_longest_lease,
    handed_young,
    holder_lease_end,
    owner_prefix,
    prepare_admit,
)
from ..engine.channel import limit_waits, settle_all
from ..engine.holder import parse_holder, unit_of
from ..engine.keeper import lease_keeper
from ..engine.parking import GaveUp, ParkAdmitCall, ParkAsk, run_id
from ..engine.parking_rate import is_rate_key
from ..engine.refusal import (
    TRANSIENT,
    describe_error,
    error_kind,
    is_transient,
    server_message,
)
from ..errors import LockStoreFull, LockStoreRefused, LockStoreUnavailable, LockWaitTimeout
from . import broker_line, handoff, parked_deadline, pool_park, signals
from .decide import Action, End, Hold, Park, Run, SendBack, Situation, WaitHere, decide
from .recovery import longest_lease, this_start
from .waiting import (
    SHORT_WAIT,
    describe,
    follow,
    requeue,
    stop_following,
    visibility_ceiling,
)
from .waiting_run import WaitingRun, without_wait

logger = logging.getLogger(__name__)

Result = TypeVar("Result")

_described: Dict[Any, str] = {}
os.register_at_fork(after_in_child=_described.clear)

#: A string as JSON text (what ``json.dumps`` does with a ``str``, without its overhead).
_json_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


#: The most characters of a run's arguments (Celery's ``argsrepr`` and ``kwargsrepr``,
#: what Flower shows) that its holder entry keeps for operators.
ARGS_SHOWN = 200


def _args_of(request: Any) -> Optional[str]:
    """A run's arguments as Celery wrote them for people (``argsrepr``, then
    ``kwargsrepr`` unless empty), cut to :data:`ARGS_SHOWN`; None when it has none."""
    args = getattr(request, "argsrepr", None)
    kwargs = getattr(request, "kwargsrepr", None)
    shown = " ".join(str(part) for part in (args, kwargs) if part and part != "{}")
    if len(shown) > ARGS_SHOWN:
        shown = shown[:ARGS_SHOWN - 1] + "\u2026"
    return shown or None


def _describe(task_name: str, worker: Any, task_id: Any, pid: Optional[int] = -1,
              args: Optional[str] = None) -> str:
    """Who holds a slot, for operators: JSON with the task, its id, the worker, the process
    (this one, unless ``pid`` says another, or None for none) and the run's arguments
    as Celery shows them (:func:`_args_of`), if any.

    The part that only changes with the process is made once per task and process."""
    start = _described.get((task_name, worker, pid))
    if start is None:
        pid_text = "null" if pid is None else os.getpid() if pid == -1 else pid
        start = _described[(task_name, worker, pid)] = (
            f'{{"task": {json.dumps(task_name)}, "worker": {json.dumps(worker)}, '
            f'"pid": {pid_text}, "id": '
        )
    task_id = _json_string(task_id) if type(task_id) is str else json.dumps(task_id)
    if args is None:
        return f"{start}{task_id}}}"
    return f'{start}{task_id}, "args": {_json_string(args)}}}'


def _describe_unadopted(task_name: str, worker: Any, task_id: Any,
                        args: Optional[str] = None) -> str:
    """Who holds a slot that the worker's main process took for a run no pool process
    has adopted: no process id, so that a lost pool process's slots are freed once the
    process its request was accepted by is gone (see :func:`~.recovery.free_run_slots`).
    """
    return _describe(task_name, worker, task_id, pid=None, args=args)


def task_settings(task: Any) -> Settings:
    """The package settings of ``task``'s app, read once per task object."""
    settings = getattr(task, "_redislock_settings", None)
    if settings is None:
        settings = read_settings(task._get_app())
        task._redislock_settings = settings
    return settings


@dataclass(frozen=True)
class _Setup:
    """What every run of a task under ``limits`` takes from its app and limits: worked
    out on its first run and kept on the task object."""

    limits: TaskLimits
    settings: Settings
    client: Any
    #: How long a slot handed to one of its runs stays reserved (worker runs).
    reserve_ms: int
    #: Owes the moves of parked lines handed a slot (see :mod:`.handoff`).
    publish: Callable[[Any], Any]
    #: How long a served reference of the parking line is kept (ms; see
    #: :func:`.broker_line.keep_served_ms`): read from the app's broker settings once.
    keep_served_ms: int
    #: :meth:`parks`' last answer: for the limiters (the same list for every run of a
    #: task with constant limits), and whether the worker had an event loop.
    _parks: Dict[bool, Tuple[Sequence[Any], bool]] = field(
        default_factory=dict, compare=False, repr=False)

    def parks(self, limiters: Sequence[Any], loop: bool, task_name: str) -> bool:
        """Whether a run under ``limiters`` waits on the parking line (see
        :func:`.broker_line.parks`), worked out once for constant limiters."""
        known = self._parks.get(loop)
        if known is not None and known[0] is limiters:
            return known[1]
        parks = broker_line.parks(self.settings, self.client, limiters, loop=loop,
                                  task_name=task_name, max_wait=self.limits.retry.max_wait)
        self._parks[loop] = (limiters, parks)
        return parks

    @classmethod
    def of(cls, task: Any, limits: TaskLimits) -> _Setup:
        setup = getattr(task, "_redislock_setup", None)
        if setup is None or setup.limits is not limits:
            settings = task_settings(task)
            client = redis_client(task._get_app(), settings) if settings.enabled else None
            if client is not None:  # the grace after a loss of the store covers it
                declare_longest_lease(client, longest_lease(task._get_app(), limits.lease))
            setup = task._redislock_setup = cls(
                limits=limits,
                settings=settings,
                client=client,
                reserve_ms=handoff.reservation_ms(limits.lease),
                publish=functools.partial(handoff.publish, task.app),
                keep_served_ms=broker_line.keep_served_ms(task),
            )
        return setup


@dataclass
class _Attempt:
    """One run of a task asking its limits for admission: what every step needs."""

    task: Any
    setup: _Setup
    request: Any
    limiters: Sequence[Any]
    description: str
    owner: str
    #: The wait so far, as the message carries it.
    waited: WaitingRun
    promises: Dict[str, int]
    #: Eager runs have no queue to go back to, nor a broker to hand slots over through.
    eager: bool
    reserve_ms: int
    #: It waits on the parking line (``redislock_line = "broker"``; see :mod:`.broker_line`).
    parking: bool = False

    @classmethod
    def of(cls, task: Any, setup: _Setup, args: Sequence[Any], kwargs: Mapping[str, Any],
           request: Any, pid: Optional[int] = -1) -> _Attempt:
        """The attempt of ``request``; its holders described with the process ``pid``
        (this one; None: no process yet, see :func:`_describe_unadopted`)."""
        waited = WaitingRun.of(request)
        eager = bool(request.is_eager)
        promises = dict(waited.promises)
        promises.update(getattr(request, PROMISED, None) or {})
        return cls(
            task=task, setup=setup, request=request,
            limiters=setup.limits.limiters(args, kwargs, setup.settings.prefix),
            description=_describe(task.name, request.hostname, request.id, pid=pid,
                                  args=_args_of(request)),
            owner=owner_prefix(request.hostname or "", request.id or "",
                               this_start(request.hostname)),
            waited=waited, promises=promises,
            eager=eager, reserve_ms=0 if eager else setup.reserve_ms,
        )

    def admit(self, probe: bool = False, book_ms: int = 0) -> Outcome:
        """One admission attempt (a probe, a booking: see :func:`admit`); the hand-offs
        it brings are published at once. On the parking line (``parking``: a pool
        process, see :mod:`.pool_park`), its one script."""
        if self.parking:
            call = broker_line.prepare(self.setup.client, self.limiters, self.park_ask())
            if call is not None:
                return self.published(call.outcome(
                    call.script.run(self.setup.client, call.keys, call.args)))
        return self.published(admit(
            self.setup.client, self.limiters, lease=self.setup.limits.lease,
            description=self.description, promises=self.promises, owner=self.owner,
            reserve_ms=self.reserve_ms, probe=probe, book_ms=book_ms))

    def park_ask(self, book_ms: int = 0, priority: Optional[int] = None) -> ParkAsk:
        """This run's ask of the parking line (:func:`.broker_line.prepare`)."""
        retry = self.setup.limits.retry
        return ParkAsk(lease=self.setup.limits.lease,
                       run=run_id(self.request.id, self.request.retries or 0),
                       parked=broker_line.parked_ref(self.waited),
                       description=self.description, owner=self.owner,
                       keep_served_ms=self.setup.keep_served_ms, max_wait=retry.max_wait,
                       book_ms=book_ms, priority=priority,
                       priority_aging=retry.priority_aging,
                       copy=self.waited.move if getattr(self.task, "acks_late", False)
                       else "")

    def published(self, outcome: Any) -> Any:
        """``outcome``, the hand-offs it brings published."""
        if outcome.handoffs:
            handoff.publish(self.task.app, outcome.handoffs)
        return outcome


#: What :func:`_first_outcome` answers when the run is to go on without a slot.
_WITHOUT_SLOT = object()


def run_limited(
    task: Any,
    limits: TaskLimits,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    body: Callable[[], Result],
    request: Any = None,
) -> Result:
    """Run ``body`` for the current request of ``task`` (``request``, if the caller has it
    at hand) once its limits admit it.

    Not admitted: the run is re-queued with a countdown (worker), or waits here (eager).
    Admitted: the slots are kept alive while ``body`` runs and given back however it ends.
    """
    setup = _Setup.of(task, limits)
    if not setup.settings.enabled:
        return body()
    request = task.request if request is None else request
    if not request.is_eager:
        parked_deadline.fail_if_gave_up(request)
    handed = None if request.is_eager else getattr(request, ADMITTED, None)
    if handed and handed.get(MAIN_RELEASES) and handed_young(handed):
        return _run_holding(task, request, Lease.of_handover(setup.client, handed), body,
                            since=WaitingRun.of(request).since)
    attempt = _Attempt.of(task, setup, args, kwargs, request)
    attempt.parking = not attempt.eager and pool_park.parks_here(setup.settings, setup.client,
                                                                 attempt.limiters)
    if handed:
        lease = _adopt(attempt, handed)
        if lease is not None:
            return _holding(attempt, lease, body)
    elif attempt.waited.follows and not attempt.eager:
        _follows_on(attempt, args, kwargs)
    outcome = _first_outcome(attempt)
    if outcome is _WITHOUT_SLOT:
        return body()
    lease = _lease_or_wait(attempt, args, kwargs, outcome)
    return _holding(attempt, lease, body)


#: The request field that carries a lease the worker's main process was admitted to, for
#: the pool process that runs the task to adopt (see :func:`admit_before_pool`).
ADMITTED = "redislock_admitted"


#: The key of an admitted lease's record (:data:`ADMITTED`) that says the worker's main
#: process gives it back when it learns of the run's end (see :func:`release_for_pool`):
#: the pool process neither adopts it nor releases it, unless it comes to it too late
#: for that (see :func:`~..engine.admission.handed_young`), and only renews it should
#: the run last that long.
MAIN_RELEASES = "main_releases"


def release_for_pool(task: Any, limits: TaskLimits, handed: Mapping[str, Any]) -> None:
    """Give back, from the worker's main process, the lease it was admitted to for a run
    that a pool process has ended (:data:`MAIN_RELEASES`), as :func:`give_back` does:
    the release goes out with this thread's next request to the lock store (usually
    the next run's admission), or from the lease keeper within about 10 ms.

    A pool process that came to the run too late to take it over unadopted adopted it
    under a description of its own, and released it itself: this release then finds
    nothing to free."""
    setup = _Setup.of(task, limits)
    lease = Lease.of_handover(setup.client, handed)
    try:
        lease.release_soon(setup.publish, with_next_request=True)
    except RedisError as exc:
        logger.warning(
            "celery-redislock: task %s: could not release its slot of %r (%s); the slot "
            "comes back when its lease ends, within %.0f s",
            task.name, lease.name, describe_error(exc), lease.lease_seconds,
        )


#: The request field that carries the start times rate limiters promised a run while the
#: worker's main process held it back (see :func:`admit_before_pool`), for the pool
#: process that asks with them (a run the main process found admissible but could not
#: take yet: it may start once its pool process asks).
PROMISED = "redislock_promised"

#: After the lock store failed the worker's main process, how long (s) it asks no more:
#: runs are sent back to wait as if the store had failed them (or, with
#: ``redislock_fail_open``, go to the pool).
MAIN_PROCESS_PAUSE_AFTER_ERROR = 5.0
_main_process_skips_until = [float("-inf")]

#: How long (s) the worker's main process waits for the lock store (to connect, or for
#: an answer) before it counts it failed (a plain ``redis.Redis`` client only).
MAIN_PROCESS_TIMEOUT = 1.0


@dataclass(frozen=True)
class Later:
    """What :func:`admit_before_pool` answers for a run to be held in the worker's main
    process and asked about again after ``seconds``: a rate limiter promised it a start
    that close (``promises``, to ask with), or (``probed``) it would be admitted but no
    pool process is free for it; or held until then and started without asking again,
    under the start its rate limiter booked for it (``booked``)."""

    seconds: float
    promises: Dict[str, int]
    probed: bool = False
    booked: Optional[Booked] = None


#: The answer of :func:`admit_before_pool`: the lease to adopt, a hold, a run to park
#: (:class:`Parked`, defined below), or None.
BeforePool = Union[None, Dict[str, Any], Later, "Parked", parked_deadline.GaveUpHere]


def admit_before_pool(task: Any, limits: TaskLimits, request: Any, *, room: bool = True,
                      promises: Optional[Mapping[str, int]] = None,
                      may_wait: bool = True) -> BeforePool:
    """Decide in the worker's main process, before the pool sees the request, whether
    this run may start. ``request`` is the task's context (``args``, ``kwargs``,
    ``headers``, ``delivery_info``...), as the pool process would see it; ``room``: a
    pool process is free to start it at once.

    * admitted (``room`` only): what the pool process is to adopt
      (:meth:`Lease.handover`: the slots, or the rate limits' starts, taken here);
    * ``Ignore``: the run ends here (sent back to wait, served by another copy,
      following an earlier run; the lock store failed and it is sent back to wait for
      it), after which the caller acknowledges the message without running it;
    * :class:`Later`: hold the request here and ask again then (a rate limiter's start
      within :func:`_short_wait`, at most when ``may_wait``; or no room for a run that
      the limits would admit: a probe, which takes nothing, found it so); or, when the
      run's one limiter is a rate limiter, hold it until the start booked for it then
      (:class:`~..engine.admission.Booked`) and start it without asking again;
    * None: the pool process is to decide as before (the package is disabled, the run
      gave up waiting: its failure belongs in the task's trace; ``redislock_fail_open``
      and the lock store failed).
    """
    asking = ask_before_pool(task, limits, request, room=room, promises=promises,
                             may_wait=may_wait)
    return asking.blocking() if isinstance(asking, Asking) else asking


def ask_before_pool(task: Any, limits: TaskLimits, request: Any, *, room: bool = True,
                    promises: Optional[Mapping[str, int]] = None,
                    may_wait: bool = True, loop: bool = False) -> Union[BeforePool, Asking]:
    """:func:`admit_before_pool` up to the admission: the answer when it needs none (the
    package is disabled, the main process asks no store for a while after a failure),
    else the :class:`Asking` that asks the store (blocking, or sent by the caller, which
    hands it the reply: the worker's event loop, see :mod:`.hub_store`). ``loop``: the
    worker has an event loop (a refused run may then wait on the parking line)."""
    if not limits.rules:
        return None
    setup = _Setup.of(task, limits)
    if not setup.settings.enabled:
        return None
    args, kwargs = tuple(request.args or ()), dict(request.kwargs or {})
    attempt = _Attempt.of(task, setup, args, kwargs, request, pid=None)  # unadopted
    attempt.promises.update(promises or {})
    if not loop and pool_park.parks_here(setup.settings, setup.client, attempt.limiters):
        return None  # no event loop: it parks in the process (greenlet) that runs it
    attempt.parking = setup.parks(attempt.limiters, loop, task.name)
    if time.monotonic() < _main_process_skips_until[0]:
        return _without_store(attempt, args, kwargs, None)
    asking = Asking(attempt, args, kwargs, room, may_wait)
    try:
        if attempt.waited.follows:
            _follows_on(attempt, args, kwargs)
    except RedisError as exc:
        return asking.failed(exc)
    except LockWaitTimeout:
        return None
    return asking


@dataclass
class Asking:
    """One run's admission in the worker's main process, between the question and the
    answer: :meth:`blocking` asks and answers; or the caller sends :meth:`call` itself
    and hands the reply to :meth:`replied` (or the failure to :meth:`failed`). Either way
    the outcome goes through :func:`decide` and is carried out by :meth:`answered`."""

    attempt: _Attempt
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    room: bool
    may_wait: bool

    def __post_init__(self) -> None:
        request = self.attempt.request
        self.short_wait = _short_wait(self.attempt.task, request)
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
            priority = broker_line.priority_of(attempt.setup.limits.retry.priority,
                                               attempt.request)
            return broker_line.prepare(self.client, attempt.limiters,
                                       attempt.park_ask(self.book_ms, priority))
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
        :func:`admit_before_pool`)."""
        try:
            return _ask_before_pool(self.attempt, self.args, self.kwargs, outcome,
                                    self.may_wait, self.short_wait, self.redelivered)
        except RedisError as exc:
            return self.failed(exc)
        except LockWaitTimeout:
            return None

    def failed(self, exc: RedisError) -> BeforePool:
        """The lock store failed the main process: the run is sent back to wait for it
        (see :func:`_without_store`); a store that cannot be reached is not asked again
        for :data:`MAIN_PROCESS_PAUSE_AFTER_ERROR`."""
        if is_transient(exc):
            # The worker's main process must not wait on a lock store that does not
            # answer (a connect timeout stalls its event loop): for a while it asks no
            # more.
            _main_process_skips_until[0] = time.monotonic() + MAIN_PROCESS_PAUSE_AFTER_ERROR
        return _without_store(self.attempt, self.args, self.kwargs, exc)


def _ask_before_pool(attempt: _Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
                     outcome: Any, may_wait: bool, short_wait: float,
                     redelivered: bool) -> BeforePool:
    """The answer of :func:`admit_before_pool` for the lock store's ``outcome``."""
    if isinstance(outcome, GaveUp):  # parked past its max wait: it fails in the pool
        return parked_deadline.gave_up(attempt.task, attempt.request, outcome,
                                       attempt.setup.limits.retry.max_wait)
    action = decide(outcome, Situation(may_hold=may_wait, short_wait=short_wait,
                                       redelivered=redelivered))
    if isinstance(action, Park):
        return _parked(attempt, action, outcome_time(outcome))
    if not isinstance(action, Hold):
        return _carry_out(attempt, args, kwargs, outcome, action).handover()
    if action.look_for_earlier:
        _follow_an_earlier_run(attempt, args, kwargs, outcome)
    if action.promise is not None:
        attempt.promises[action.promise[0]] = action.promise[1]
    return Later(action.seconds, attempt.promises, probed=action.probed,
                 booked=action.booked)


@dataclass(frozen=True)
class Parked:
    """What :func:`admit_before_pool` answers for a run refused on the parking line: its
    reference ``ref`` was written; the caller publishes its copy, with the wait ``wait``,
    to ``ref``'s parking queue, then acknowledges the original (see ``gate``)."""

    ref: broker_line.ParkRef
    wait: WaitingRun
    name: str


def _parked(attempt: _Attempt, park: Park, server_ms: int) -> Parked:
    """The run is to wait in the parking line of ``park.ref`` (said as a refusal is)."""
    task, request = attempt.task, attempt.request
    wait = broker_line.parked_wait(attempt.waited, park.ref, server_ms or None)
    if is_rate_key(park.ref.key):  # said as on the old line: a rate refusal, not a slot's
        signals.rate_limited.send(sender=task, task_id=request.id, key=park.name,
                                  countdown=0.0, promise=None)
    else:
        signals.lock_contended.send(sender=task, task_id=request.id, key=park.name,
                                    countdown=0.0, reason=f"parked behind {park.name!r}")
    why = ("a later start of the rate %r is promised to it" if is_rate_key(park.ref.key)
           else "the slots of %r are taken")
    logger.log(logging.DEBUG if attempt.waited.parked else logging.INFO,
               "celery-redislock: task %s[%s] parked: " + why + "; it waits in their parking "
               "queue (attempt %d)", task.name, request.id, park.name, wait.attempts)
    return Parked(park.ref, wait, park.name)


def _without_store(attempt: _Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
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
        report_store_error(task, request.id, _names(attempt.limiters), exc)
    if attempt.parking:  # one copy: held here, never re-published (its header kept)
        if exc is not None and error_kind(exc) == "unreachable":  # else said above
            logger.info("celery-redislock: task %s[%s] held: it could not reach the lock "
                        "store; it asks again in %.2f s", task.name, request.id, STORE_HOLD)
        return Later(STORE_HOLD, attempt.promises)
    requeue(task, request, args, kwargs, attempt.setup.limits.retry, None)


#: The parking line: how long (s) the worker's main process holds a run the lock store
#: did not answer for before it asks again (the run stays one message, unacknowledged
#: here, instead of a copy sent back with a countdown: a copy published and the original
#: acknowledged is a window no reference tells apart).
STORE_HOLD = 0.5


def _adopt(attempt: _Attempt, handed: Mapping[str, Any]) -> Optional[Lease]:
    """The lease the worker's main process was admitted to for this run, now this
    process's (renewed, under its own description); None when it ran out meanwhile or
    the lock store did not answer: the run then asks anew."""
    try:
        return Lease.adopt(attempt.setup.client, handed, attempt.description,
                           answer_later=True)
    except RedisError:
        return None


def _first_outcome(attempt: _Attempt) -> Any:
    """The first admission's outcome; None when the lock store could not be reached and
    the run is to ask again later (fail closed), :data:`_WITHOUT_SLOT` when it is to run
    without a slot (``redislock_fail_open``)."""
    task, request = attempt.task, attempt.request
    try:
        return attempt.admit()
    except RedisError as exc:
        names = _names(attempt.limiters)
        if attempt.setup.settings.fail_open and is_transient(exc):
            logger.warning("celery-redislock: task %s[%s] runs WITHOUT A SLOT of %s: %s, and "
                           "redislock_fail_open is set", task.name, request.id, names,
                           describe_error(exc))
            return _WITHOUT_SLOT
        report_store_error(task, request.id, names, exc)
        if attempt.eager:
            raise eager_store_error(task.name, exc) from exc
        # Fail closed: never run unlimited, never drop the task; ask again later (the
        # deferral is logged once at INFO; the worker said at start where the store is).
        return None


def _lease_or_wait(attempt: _Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
                   outcome: Any) -> Lease:
    """The lease of an admitted run, in a pool process (or an eager run's thread). A run
    not admitted ends here (``Ignore``: re-queued, or served by another copy of its
    message), or, eager, waits for its lease in place. A run due to start very soon
    waits for it here rather than going round the broker, whose delivery delay (tens to
    hundreds of milliseconds under a backlog) would make it late and lose the rate that
    start stood for: the only wait inside a worker process, never longer than
    :func:`_short_wait` at a time, twice at the most."""
    request = attempt.request
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    short_wait = _short_wait(attempt.task, request)
    for sleeps in range(SHORT_SLEEPS + 1):
        action = decide(outcome, Situation(
            eager=attempt.eager, may_hold=sleeps < SHORT_SLEEPS, short_wait=short_wait,
            redelivered=redelivered and sleeps == 0))
        if not isinstance(action, Hold):
            break
        if action.look_for_earlier:
            _follow_an_earlier_run(attempt, args, kwargs, outcome)
        outcome = _sleep_then_ask(attempt, action)
    return _carry_out(attempt, args, kwargs, outcome, action)


#: How many times a pool process sleeps for a rate limit's start before it sends the run
#: back to the broker instead.
SHORT_SLEEPS = 2


def _sleep_then_ask(attempt: _Attempt, hold: Hold) -> Any:
    """Sleep until the start ``hold`` promised, then ask again; None when the lock store
    did not answer (the run is then sent back, as when it fails the first ask)."""
    assert hold.promise is not None  # a pool process holds only for a promised start
    attempt.promises[hold.promise[0]] = hold.promise[1]
    time.sleep(hold.seconds)
    try:
        return attempt.admit()
    except RedisError as exc:
        report_store_error(attempt.task, attempt.request.id, _names(attempt.limiters), exc)
        return None


def _carry_out(attempt: _Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
               outcome: Any, action: Action) -> Lease:
    """Do what :func:`decide` chose (anything but a hold): the lease to run under, or the
    run ends here (``Ignore``: re-queued, or served by another copy of its message), or,
    eager, it waits for its lease in place."""
    task, request, limits = attempt.task, attempt.request, attempt.setup.limits
    if isinstance(action, End):
        logger.debug("celery-redislock: task %s[%s]: served already (%r)", task.name,
                     request.id, action.name)
        raise Ignore()
    assert not isinstance(action, Hold)
    if isinstance(outcome, GaveUp):  # parked past its max wait
        raise LockWaitTimeout(parked_deadline.gave_up(task, request, outcome,
                                                      limits.retry.max_wait).message)
    if isinstance(action, Park):  # parked from here (pool_park), else it waits as today
        parked = _parked(attempt, action, outcome_time(outcome))
        if attempt.parking and pool_park.park_here(task, request, args, kwargs, parked.ref,
                                                   parked.wait):
            raise Ignore()
        action = SendBack(outcome)
    if not isinstance(action, WaitHere) and action.look_for_earlier:
        _follow_an_earlier_run(attempt, args, kwargs, outcome)
    if isinstance(action, Run):
        return action.lease
    if isinstance(action, SendBack):  # one copy, with a countdown, in no line
        requeue(task, request, args, kwargs, limits.retry, action.refusal)
    return _wait_in_place(task, limits, attempt.setup.client, attempt.limiters,
                          attempt.description, attempt.owner, action.refusal)


def _run_holding(task: Any, request: Any, lease: Lease, body: Callable[[], Result], *,
                 since: Optional[int] = None,
                 publish: Optional[Callable[[Any], Any]] = None) -> Result:
    """Run ``body`` holding ``lease``: kept alive meanwhile, given back however it ends
    (owing with ``publish`` the moves of parked lines handed its slots), or left
    for the worker's main process to give back (no ``publish``: :data:`MAIN_RELEASES`).
    ``since``: when the run first asked (server ms), for the ``lock_acquired`` signal."""
    _served_at_start(task, request, lease)
    _forget_wait(request)
    holds_slots = lease.holds_slots
    if holds_slots:
        lease_keeper().keep(lease, on_lost=lambda lost: signals.lease_lost.send(
            sender=task, task_id=request.id, lease=lost))
        logger.debug("celery-redislock: task %s[%s] admitted to %r (fence %d)",
                     task.name, request.id, lease.name, lease.fence)
    request.redislock_lease = lease
    lease_started = time.monotonic()
    if signals.lock_acquired.receivers:
        signals.lock_acquired.send(
            sender=task, task_id=request.id, lease=lease,
            waited=(lease.acquired_at_ms - since) / 1000.0 if since else 0.0,
        )
    try:
        return body()
    finally:
        if holds_slots:
            if publish is None:
                lease_keeper().forget(lease)
            else:
                give_back(task, lease, request, publish)
            if signals.lock_released.receivers:
                signals.lock_released.send(
                    sender=task, task_id=request.id, lease=lease,
                    held=time.monotonic() - lease_started,
                )


def _served_at_start(task: Any, request: Any, lease: Lease) -> None:
    """A copy moved out of a parking queue starts its body, its message acknowledged
    (default acks): its reference becomes served, so that a copy given back later ends
    unrun. (Under ``acks_late`` its release does it, with the copy's id: this very copy,
    given back unacknowledged after its worker died, runs again, as Celery runs it.)"""
    if getattr(task, "acks_late", False) or not WaitingRun.of(request).parked:
        return
    try:
        broker_line.started(lease)
    except RedisError as exc:  # the release marks it served
        logger.warning("celery-redislock: task %s[%s]: could not mark its parked run served "
                       "(%s)", task.name, request.id, describe_error(exc))


def _holding(attempt: _Attempt, lease: Lease, body: Callable[[], Result]) -> Result:
    """:func:`_run_holding` for a run that asked (``attempt``) and releases itself."""
    return _run_holding(attempt.task, attempt.request, lease, body,
                        since=attempt.waited.since, publish=attempt.setup.publish)


def _follow_an_earlier_run(attempt: _Attempt, args: Sequence[Any],
                           kwargs: Mapping[str, Any], outcome: Any) -> None:
    """A redelivered message (acks_late, visibility timeout) may meet the earlier run of
    the same task id still holding a live lease.

    Admitted (slots were free), it runs beside that run, as Celery alone would run it:
    a warning says so. Refused, it *follows* that run (see :func:`.waiting.follow`)
    instead of waiting in line by the time the run first asked, which would put it
    before every run parked since and run the task again as soon as the earlier run
    ended: a body longer than the visibility timeout would then run again and again
    while the line starved. Without a live earlier run, the run goes on as any other."""
    task, request = attempt.task, attempt.request
    if outcome is None:
        return  # the lock store did not answer: nothing to look at
    try:
        earlier = _earlier_run(attempt.setup.client, attempt.limiters, request.id, outcome)
    except RedisError:
        return
    if earlier is None:
        return
    if isinstance(outcome, Lease):
        logger.warning(
            "celery-redislock: task %s[%s] was redelivered while an earlier run of it still "
            "holds a slot of %r; this run runs beside it (slots were free)",
            task.name, request.id, earlier["name"])
        return
    follow(task, request, args, kwargs, earlier, _follow_countdown(attempt))


def _earlier_run(client: Any, limiters: Sequence[Any], task_id: str,
                 outcome: Any) -> Optional[Dict[str, Any]]:
    """The live holder entry of another run of ``task_id`` in one of the semaphores of
    ``limiters``: its semaphore's key and name, its member, when it took the slot and
    when its lease ends (server ms); or None."""
    marker = f"|{task_id}|"
    own = outcome.token if isinstance(outcome, Lease) else None
    for limiter in limiters:
        if not isinstance(limiter, SlotLimit):
            continue
        live = client.zrangebyscore(limiter.key, f"({outcome_time(outcome)}", "+inf",
                                    withscores=True)
        for member, score in live:
            holder = parse_holder(member, score)
            if unit_of(holder.member) is not None:
                continue  # a weighted holder's further slot: its entry is listed too
            if marker in holder.token and holder.token != own:
                return {"key": limiter.key, "name": limiter.name, "member": holder.member,
                        "since": holder.acquired_ms, "until": holder.lease_end_ms}
    return None


def _follow_countdown(attempt: _Attempt) -> float:
    """How long a run that follows an earlier one waits between looks: a quarter of the
    lease (renewals keep the lease at least two thirds of its length ahead, so a run
    that ended is told from one whose lease ran out), within the broker's visibility
    timeout."""
    countdown = max(attempt.setup.limits.lease / 4, 0.05)
    ceiling = visibility_ceiling(attempt.task)
    return countdown if ceiling is None else min(countdown, ceiling)


def _follows_on(attempt: _Attempt, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """A run that follows an earlier run of its task (see :func:`.waiting.follow`)
    looks at it: still holding, the run goes back (``Ignore``); ended before its lease
    did, the run ends (``Ignore``); freed by its worker as dead, or its lease ran out
    unrenewed (its whole worker died), the run goes on to ask for a slot, as any
    waiting run."""
    earlier = dict(attempt.waited.follows or {})
    task, request = attempt.task, attempt.request
    try:
        now_ms, lease_end = holder_lease_end(attempt.setup.client, str(earlier["key"]),
                                             str(earlier["member"]))
    except RedisError:
        now_ms, lease_end = 0, int(earlier["until"])  # look again later
    if lease_end > 0:
        earlier["until"] = lease_end
        follow(task, request, args, kwargs, earlier, _follow_countdown(attempt))
    if lease_end != FREED_AS_LOST and now_ms < int(earlier["until"]):
        logger.info("celery-redislock: task %s[%s]: the earlier run it followed has ended; "
                    "this copy of its message ends without running", task.name, request.id)
        raise Ignore()
    logger.warning("celery-redislock: task %s[%s]: the earlier run it followed died (its "
                   "slot of %r was freed unreleased); this copy asks for a slot",
                   task.name, request.id, earlier.get("name"))
    attempt.waited = stop_following(request)


def _short_wait(task: Any, request: Any) -> float:
    """How long (seconds) a run of ``task`` may wait for its start in the worker process:
    :data:`~celery_redislock.integration.waiting.SHORT_WAIT`, and at most a quarter of
    any time limit of the run, whose clock runs while it waits."""
    limits = [*(getattr(request, "timelimit", None) or ()),
              getattr(task, "time_limit", None), getattr(task, "soft_time_limit", None)]
    return min([SHORT_WAIT, *(limit / 4 for limit in limits
                              if isinstance(limit, (int, float)) and limit > 0)])


def outcome_time(outcome: Any) -> int:
    """The server time (ms) an admission attempt saw, or 0 when unknown."""
    if isinstance(outcome, Lease):
        return outcome.acquired_at_ms
    return getattr(outcome, "server_time_ms", 0)


def _forget_wait(request: Any) -> None:
    """Admitted: the wait is over. Drop its header, which ``self.retry()`` would copy."""
    headers = getattr(request, "headers", None)
    stripped = without_wait(headers)
    if stripped is not headers:
        request.headers = stripped


def _wait_in_place(task: Any, limits: TaskLimits, client: Any, limiters: Sequence[Any],
                   description: str, owner: str, outcome: Any) -> Lease:
    """Eager runs (``apply()``, ``task_always_eager``) have no queue to go back to: they
    wait here, at most ``max_wait`` seconds."""
    max_wait = limits.retry.max_wait
    deadline = None if max_wait is None else time.monotonic() + max_wait
    promises: Dict[str, int] = {}
    pause = 0.01
    if isinstance(outcome, (Busy, RateLimited, Paused)):
        _say_eager_wait(task, outcome, max_wait)
    while not isinstance(outcome, Lease):
        if isinstance(outcome, RateLimited):
            promises[outcome.key] = outcome.promise
            sleep = outcome.wait
        else:
            assert isinstance(outcome, (Busy, Paused))
            hint = outcome.retry_hint if outcome.retry_hint is not None else pause
            sleep = min(pause, max(hint, 0.001))
            pause = min(pause * 2, 0.5)
        if deadline is not None and time.monotonic() + sleep > deadline:
            raise LockWaitTimeout(
                f"Task {task.name!r} {describe(outcome, task)} and gave up after its "
                f"max_wait of {max_wait} s"
            )
        time.sleep(max(sleep, 0.001))
        outcome = admit(client, limiters, lease=limits.lease, description=description,
                        promises=promises, owner=owner)
    return outcome


def _say_eager_wait(task: Any, outcome: Union[Busy, RateLimited, Paused],
                    max_wait: Optional[float]) -> None:
    """One WARNING as an eager run starts to wait: it uses the lock store's real slots
    and rates (those of running workers, too), and waits in the calling thread."""
    how_long = ("for ever: set lock_max_wait, or redislock_enabled = False in tests"
                if max_wait is None else f"at most {max_wait:g} s (lock_max_wait)")
    logger.warning("celery-redislock: eager run of task %s (apply() or task_always_eager) "
                   "%s; it takes the lock store's real slots and rates, and waits here %s",
                   task.name, describe(outcome, task), how_long)


def report_store_error(task: Any, task_id: Any, names: str, exc: BaseException) -> None:
    """Log a failed call to the lock store for a run, by what it means, with the server's
    message, and send ``lock_store_error``. An outage is logged at DEBUG (the worker said
    at start where the store is), a fail-over or a server loading its data is a warning:
    runs wait for them. A full store or a refusal is an
    error: it will not pass by itself."""
    kind = error_kind(exc)
    if kind == "unreachable":  # the worker said at start where the store is; the
        logger.debug("celery-redislock: task %s[%s]: %s, for %s",  # deferral is at INFO
                     task.name, task_id, describe_error(exc), names)
    elif kind in TRANSIENT:
        logger.warning("celery-redislock: task %s[%s]: %s, for %s; it waits as for an outage",
                       task.name, task_id, describe_error(exc), names)
    else:
        logger.error("celery-redislock: task %s[%s]: %s, for %s; the run waits (never run "
                     "without its limit) until this is fixed", task.name, task_id,
                     describe_error(exc), names)
    signals.lock_store_error.send(sender=task, task_id=task_id, key=names, kind=kind,
                                  message=server_message(exc))


def eager_store_error(task_name: str, exc: BaseException) -> LockStoreUnavailable:
    """The exception an eager run raises for a failed call to the lock store."""
    kind = error_kind(exc)
    if kind == "full":
        return LockStoreFull(f"Task {task_name!r}: the lock store is full: "
                             f"{server_message(exc)}")
    if kind in TRANSIENT:
        return LockStoreUnavailable(f"Task {task_name!r}: the lock store is unreachable: "
                                    f"{server_message(exc)}")
    return LockStoreRefused(f"Task {task_name!r}: {describe_error(exc)}")


def _names(limiters: Sequence[Any]) -> str:
    return ", ".join(repr(limiter.name) for limiter in limiters)


def give_back(task: Any, lease: Lease, request: Any,
              publish: Callable[[Any], Any]) -> None:
    """Release ``lease``; if Redis cannot be reached, its lease runs out by itself.

    A worker's run does not wait for the answer, and its release goes out with the
    process's next request to the lock store (usually its next run's admission), or
    from the lease keeper within about 10 ms (see :meth:`Lease.release_soon`): also
    when the run stores a result or has a chain, a callback or a chord. Whoever
    learns of the run's end and asks for the slot before the release is written (the
    chain's next step, a client that read the result) finds it taken, parks, and is
    handed the slot by that release. A lease that
    took the last free slot, or found a line, is released at once and waits for the
    answer, which hands the slot over. An eager run waits for the answer, so that its
    caller finds the slot free the moment it returns. ``publish`` owes the moves of the
    parked line handed the freed slot."""
    lease_keeper().forget(lease)
    try:
        if request.is_eager:
            lease.release_handing_over(publish)
        else:
            lease.release_soon(publish, with_next_request=True)
    except RedisError as exc:
        logger.warning(
            "celery-redislock: task %s[%s] could not release its slot of %r (%s); the slot "
            "comes back when its lease ends, within %.0f s",
            task.name, request.id, lease.name, describe_error(exc), lease.lease_seconds,
        )
        if not is_transient(exc):
            signals.lock_store_error.send(sender=task, task_id=request.id, key=lease.name,
                                          kind=error_kind(exc), message=server_message(exc))
    else:
        logger.debug("celery-redislock: task %s[%s] released %r", task.name, request.id,
                     lease.name)


def give_back_unstarted(task: Any, limits: TaskLimits, handed: Mapping[str, Any]) -> None:
    """Give back at once the lease the worker's main process was admitted to (``handed``,
    see :func:`admit_before_pool`) for a run that will not start after all (revoked
    while its limits were asked), instead of leaving it until it runs out."""
    lease = Lease.of_handover(_Setup.of(task, limits).client, handed)
    if not lease.holds_slots:
        return
    try:
        lease.release()
    except RedisError as exc:
        logger.warning("celery-redislock: task %s: could not give back the slots of a revoked "
                       "run (%s); they come back when the lease ends, within %.0f s",
                       task.name, describe_error(exc), lease.lease_seconds)


@worker_process_shutdown.connect
@worker_shutdown.connect
def _settle_releases(**_: Any) -> None:
    """A pool child (or a solo or threads worker) that exits first writes the releases
    left for its next request and reads the answers to its last releases, so that every
    slot comes back and one freed for a waiting line is still handed over."""
    settle_all()
