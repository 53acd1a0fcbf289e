"""The pool process's interpreter of a run: the one place that carries out
:func:`~.decide.decide`'s action where the task runs (a pool process, a worker without
an event loop, an eager run's thread).

:func:`run_limited` runs the body of a run its limits admit, holding its lease (kept
alive meanwhile, given back however the body ends): the lease the worker's main
process was admitted to (left for the main process to give back, or adopted), or one
this process asks for. A run not admitted ends here (``Ignore``: parked from this
process, sent back to wait, served already, following an earlier run of its task), or
fails past its ``max_wait``; a run promised a start within :func:`~.attempt.short_wait_of`
sleeps for it here (twice at the most); an eager run waits for its lease in place.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, TypeVar, Union

from celery.exceptions import Ignore
from redis.exceptions import RedisError

from ..config.limit import TaskLimits
from ..engine.admission import Busy, Lease, Paused, RateLimited, admit, handed_young
from ..engine.keeper import lease_keeper
from ..engine.parking import GaveUp, started_soon
from ..engine.refusal import describe_error, is_transient
from ..errors import LockWaitTimeout
from ..line import parked_deadline
from ..line.waiting import describe, parked, requeue, served
from ..run import signals
from ..run.decide import Action, End, Hold, Park, Run, SendBack, Situation, WaitHere, decide
from ..run.waiting_run import WaitingRun, without_wait
from . import pool_park
from .attempt import (
    ADMITTED,
    MAIN_RELEASES,
    Attempt,
    Setup,
    limit_names,
    outcome_time,
    short_wait_of,
)
from .earlier_run import follows_on, look_at_earlier
from .give_back import give_back, give_back_exiting
from .store_errors import eager_store_error, report_store_error

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


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
    setup = Setup.of(task, limits)
    if not setup.settings.enabled:
        return body()
    request = task.request if request is None else request
    if not request.is_eager:
        parked_deadline.fail_if_gave_up(request)
    handed = None if request.is_eager else getattr(request, ADMITTED, None)
    if handed and handed.get(MAIN_RELEASES) and handed_young(handed):
        return _run_holding(task, request, Lease.of_handover(setup.client, handed), body,
                            since=WaitingRun.of(request).since)
    attempt = Attempt.of(task, setup, args, kwargs, request)
    attempt.parking = not attempt.eager and pool_park.parks_here(setup.settings, setup.client,
                                                                 attempt.limiters)
    attempt.unsent_ms = pool_park.UNSENT_MS  # it confirms its parked copy (pool_park.sent)
    if handed:
        lease = _adopt(attempt, handed)
        if lease is not None:
            return _holding(attempt, lease, body)
    elif attempt.waited.follows and not attempt.eager and follows_on(attempt, args, kwargs):
        raise Ignore()  # it went back to follow the earlier run, or that run ended
    outcome = _first_outcome(attempt)
    if outcome is _WITHOUT_SLOT:
        return body()
    lease = _lease_or_wait(attempt, args, kwargs, outcome)
    return _holding(attempt, lease, body)


def _adopt(attempt: Attempt, handed: Mapping[str, Any]) -> Optional[Lease]:
    """The lease the worker's main process was admitted to for this run, now this
    process's (renewed, under its own description); None when it ran out meanwhile or
    the lock store did not answer: the run then asks anew."""
    try:
        return Lease.adopt(attempt.setup.client, handed, attempt.description,
                           answer_later=True)
    except RedisError:
        return None


def _first_outcome(attempt: Attempt) -> Any:
    """The first admission's outcome; None when the lock store could not be reached and
    the run is to ask again later (fail closed), :data:`_WITHOUT_SLOT` when it is to run
    without a slot (``redislock_fail_open``)."""
    task, request = attempt.task, attempt.request
    try:
        return attempt.admit()
    except RedisError as exc:
        names = limit_names(attempt.limiters)
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


def _lease_or_wait(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
                   outcome: Any) -> Lease:
    """The lease of an admitted run, in a pool process (or an eager run's thread). A run
    not admitted ends here (``Ignore``: re-queued, or served by another copy of its
    message), or, eager, waits for its lease in place. A run due to start very soon
    waits for it here rather than going round the broker, whose delivery delay (tens to
    hundreds of milliseconds under a backlog) would make it late and lose the rate that
    start stood for: the only wait inside a worker process, never longer than
    :func:`~.attempt.short_wait_of` at a time, twice at the most."""
    request = attempt.request
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    short_wait = short_wait_of(attempt.task, request)
    for sleeps in range(SHORT_SLEEPS + 1):
        action = decide(outcome, Situation(
            eager=attempt.eager, may_hold=sleeps < SHORT_SLEEPS, short_wait=short_wait,
            redelivered=redelivered and sleeps == 0))
        if not isinstance(action, Hold):
            break
        if action.look_for_earlier and look_at_earlier(attempt, args, kwargs, outcome):
            raise Ignore()  # sent back to follow the earlier run of its task
        outcome = _sleep_then_ask(attempt, action)
    return _carry_out(attempt, args, kwargs, outcome, action)


#: How many times a pool process sleeps for a rate limit's start before it sends the run
#: back to the broker instead.
SHORT_SLEEPS = 2


def _sleep_then_ask(attempt: Attempt, hold: Hold) -> Any:
    """Sleep until the start ``hold`` promised, then ask again; None when the lock store
    did not answer (the run is then sent back, as when it fails the first ask)."""
    assert hold.promise is not None  # a pool process holds only for a promised start
    attempt.promises[hold.promise[0]] = hold.promise[1]
    time.sleep(hold.seconds)
    try:
        return attempt.admit()
    except RedisError as exc:
        report_store_error(attempt.task, attempt.request.id, limit_names(attempt.limiters), exc)
        return None


def _carry_out(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
               outcome: Any, action: Action) -> Lease:
    """Do what :func:`decide` chose (anything but a hold): the lease to run under, or the
    run ends here (``Ignore``: parked, sent back to wait, served already, sent back to
    follow the earlier run of its task), or, eager, it waits for its lease in place."""
    task, request, limits = attempt.task, attempt.request, attempt.setup.limits
    if isinstance(action, End):
        served(task, request, action.name)
        raise Ignore()
    assert not isinstance(action, Hold)
    if isinstance(outcome, GaveUp):  # parked past its max wait
        raise LockWaitTimeout(parked_deadline.gave_up(task, request, outcome,
                                                      limits.retry.max_wait).message)
    if isinstance(action, Park):  # parked from here (pool_park), else it waits as today
        run = parked(task, request, attempt.waited, action, outcome_time(outcome))
        if attempt.parking and pool_park.park_here(task, request, args, kwargs, run.ref,
                                                   run.wait):
            pool_park.sent(attempt.setup.client, run.ref, request)
            raise Ignore()
        action = SendBack(outcome)
    if (not isinstance(action, WaitHere) and action.look_for_earlier
            and look_at_earlier(attempt, args, kwargs, outcome)):
        raise Ignore()  # sent back to follow the earlier run of its task
    if isinstance(action, Run):
        return action.lease
    if isinstance(action, SendBack):  # one copy, with a countdown, in no line
        requeue(task, request, args, kwargs, limits.retry, action.refusal)
        raise Ignore()
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
    exiting = False
    try:
        return body()
    except SystemExit:  # this process is being terminated, or exits
        exiting = True
        raise
    finally:
        if holds_slots:
            if publish is None:
                lease_keeper().forget(lease)
            elif exiting:
                give_back_exiting(task, lease, request)
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
    given back unacknowledged after its worker died, runs again, as Celery runs it.) The
    mark is written before the body starts and its answer read later: a round trip less
    between the slot handed over and the body."""
    if getattr(task, "acks_late", False) or not WaitingRun.of(request).parked:
        return

    def not_marked(exc: RedisError) -> None:  # the release marks it served
        logger.warning("celery-redislock: task %s[%s]: could not mark its parked run served "
                       "(%s)", task.name, request.id, describe_error(exc))

    started_soon(lease, not_marked)


def _holding(attempt: Attempt, lease: Lease, body: Callable[[], Result]) -> Result:
    """:func:`_run_holding` for a run that asked (``attempt``) and releases itself."""
    return _run_holding(attempt.task, attempt.request, lease, body,
                        since=attempt.waited.since, publish=attempt.setup.publish)


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
