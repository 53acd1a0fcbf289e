"""What a run that was not admitted does: it goes back to the queue for later.

The run is re-published with a countdown, as :meth:`celery.Task.retry` would, but with
``retries`` unchanged, so waiting uses none of the task's ``max_retries`` budget and does
not show in ``self.request.retries``. The interpreter of the process that asked
(:mod:`.main_process`, :mod:`.pool_process`) then ends the refused run with
:class:`celery.exceptions.Ignore`: no result is stored and no callback runs; the
re-published copy, which has the same task id, carries on.

What the wait has been so far travels with the message in the ``redislock_wait`` header
(a :class:`~celery_redislock.run.waiting_run.WaitingRun`): when it started (on
the Redis server's clock), how many times the run was refused, and the start times rate
limiters promised it. On the parking line a refused run parks instead (see
:mod:`.broker_line`): a run is sent back only when it cannot park (its limits lie in
several hash slots of a Redis Cluster), as one copy in no line; how a parked run is
said and the wait its parked copy carries are here too (:func:`parked`).
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Mapping, NoReturn, Optional, Sequence, Tuple, Union

from ..config.retry import RetryPolicy
from ..engine.admission import Busy, Paused, RateLimited
from ..engine.parking_rate import is_rate_key
from ..errors import LockWaitTimeout
from ..run import signals
from ..run.decide import SHORT_WAIT, Refusal
from ..run.limited import task_settings
from ..run.waiting_run import WaitingRun
from . import broker_line

if TYPE_CHECKING:
    from ..run.decide import Park

logger = logging.getLogger(__name__)


#: Countdowns stay below this share of the broker's ``visibility_timeout``, since a longer
#: ETA is redelivered (so run twice) by the Redis and SQS transports.
VISIBILITY_SHARE = 0.5

#: What kombu's Redis and SQS transports use when ``visibility_timeout`` is not set.
DEFAULT_VISIBILITY_TIMEOUT = 3600

PUBLISH_ATTEMPTS = 3

#: A run promised a start further away than ``redislock_rate_recheck`` (1 s by default)
#: asks again before it, after the longest of that, :data:`RECHECK_SHARE` of its wait and
#: its place in the line over :data:`RECHECKS_PER_SECOND`: a rate raised at run time
#: re-plans the line, and the runs far back hear of their earlier starts within about
#: that time.
RECHECK_SHARE = 0.1
#: Runs far back in a long line ask again seldom enough that the N runs waiting for one
#: rate limiter ask at most about this many times (1 + ln(N / this)) a second.
RECHECKS_PER_SECOND = 20


def describe(refusal: Refusal, task: Any = None) -> str:
    """Why a run was refused, in the terms of the limit the user wrote (``task``'s
    options say whether its one slot per key was asked for or is the default).

        >>> from celery_redislock.engine.admission import Busy
        >>> describe(Busy(name="crawl", holders=1, slots=1, retry_hint=0.5,
        ...               average_hold=None, server_time_ms=0))
        "found the only slot of 'crawl' taken"
    """
    if isinstance(refusal, Busy):
        if refusal.cost > 1:
            return (f"needs {refusal.cost} of the {refusal.slots} slots of {refusal.name!r} "
                    f"at once and found {refusal.holders} taken")
        if refusal.slots == 1 and _default_slot(task):
            return (f"found another run of {refusal.name!r} under way (one at a time per "
                    "key: the task gives no lock_slots)")
        if refusal.slots == 1:
            return f"found the only slot of {refusal.name!r} taken"
        return f"found all {refusal.slots} slots of {refusal.name!r} taken"
    if isinstance(refusal, RateLimited):
        return f"is over the rate limit of {refusal.name!r}"
    if isinstance(refusal, Paused):
        return f"found {refusal.name!r} paused"
    return "could not reach the lock store"


def _default_slot(task: Any) -> bool:
    """True when ``task``'s slot limits are all the one a ``LimitedTask`` gets by default
    (a task with only ``lock_period``, ``lock_unique`` or ``lock_key``)."""
    try:
        rules = [rule for rule in task.task_limits().rules if rule.slots is not None]
    except Exception:  # no task, or no limits to read: say it plainly
        return False
    return bool(rules) and not any(rule.slots_given for rule in rules)


def requeue(
    task: Any,
    request: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    policy: RetryPolicy,
    refusal: Refusal,
) -> None:
    """Re-publish the current run of ``task`` with a countdown, as one copy in no line
    (the caller then ends this copy).

    ``refusal`` is why it was not admitted: :class:`Busy`, :class:`RateLimited`,
    :class:`Paused`, or None when the lock store could not be reached. Raises
    :class:`LockWaitTimeout` instead when the run has waited, or would have to wait,
    longer than ``policy.max_wait``.
    """
    run = WaitingRun.of(request)
    ceiling = visibility_ceiling(task)
    plan = plan_wait(run, refusal, policy, ceiling, task_settings(task).rate_recheck)
    if isinstance(plan, GiveUp):
        _give_up(task, request, plan, refusal)
    attempts, countdown, since = run.attempts, plan.countdown, plan.since
    wait = WaitingRun(since=since, attempts=run.attempts + 1, promises=dict(plan.promises),
                      park_id=run.park_id, line=run.line, carried=True)
    headers = wait.on(getattr(request, "headers", None))
    signature = task.signature_from_request(
        request, args, kwargs, countdown=countdown, headers=headers, retries=request.retries,
    )
    publish(signature)
    _announce(task, request, refusal, countdown)
    # Once per run at INFO (why, and until when); every later deferral at DEBUG.
    logger.log(logging.INFO if attempts == 0 else logging.DEBUG,
               "celery-redislock: task %s[%s] deferred: it %s; %s; waiting %.2f s (attempt %d)",
               task.name, request.id, describe(refusal, task),
               until_when(refusal, countdown), countdown, attempts + 1)


@dataclass(frozen=True)
class SendBackPlan:
    """How a refused run is sent back: after ``countdown`` seconds, its wait begun at
    ``since`` (server ms; None when the lock store was never reached), with the starts
    rate limiters promised it (``promises``)."""

    countdown: float
    since: Optional[int]
    promises: Mapping[str, int]


@dataclass(frozen=True)
class GiveUp:
    """The run has waited ``waited`` seconds and would wait ``must_wait`` more: past its
    ``max_wait``, it fails with :class:`LockWaitTimeout`."""

    waited: float
    must_wait: float
    max_wait: float


def plan_wait(run: WaitingRun, refusal: Refusal, policy: RetryPolicy,
              ceiling: Optional[float], recheck: Optional[float] = 1.0,
              ) -> Union[SendBackPlan, GiveUp]:
    """What :func:`requeue` does with ``run`` after ``refusal``, decided without a call
    or a clock: the refusal's server time is now. ``ceiling``: the longest countdown (see
    :func:`visibility_ceiling`); ``recheck``: ``redislock_rate_recheck``.

        >>> from celery_redislock.engine.admission import Busy
        >>> busy = Busy("crawl", 1, 1, 0.5, None, server_time_ms=10_000, key="k:s:crawl")
        >>> policy = RetryPolicy(backoff=1.0, backoff_max=60.0, jitter=False, max_wait=5.0)
        >>> plan_wait(WaitingRun(since=9_000, carried=True), busy, policy, None)
        SendBackPlan(countdown=0.5, since=9000, promises={})
        >>> plan_wait(WaitingRun(since=4_000, carried=True), busy, policy, None)
        GiveUp(waited=6.0, must_wait=0.0, max_wait=5.0)
    """
    promises: Dict[str, int] = dict(run.promises)
    since, waited = _wait_so_far(run, refusal)
    countdown, must_wait = _countdown(policy, run.attempts, refusal, promises, ceiling,
                                      recheck)
    if policy.max_wait is not None:
        if _too_long(policy.max_wait, waited, must_wait):
            return GiveUp(waited, must_wait, policy.max_wait)
        countdown = min(countdown, max(policy.max_wait - waited, 0.0))
    return SendBackPlan(countdown, since, promises)


def until_when(refusal: Refusal, countdown: float) -> str:
    """Until when a deferred run waits, for the log: times are the Redis server's, UTC.

        >>> until_when(None, 2.0)
        'back in 2.0 s'
    """
    if refusal is None:
        return f"back in {countdown:.1f} s"
    back = _clock(refusal.server_time_ms + countdown * 1000)
    if isinstance(refusal, RateLimited):
        return f"promised a start at {_clock(refusal.promise / 1000)}, back at {back}"
    if isinstance(refusal, Paused):
        end = ("until resumed" if refusal.retry_hint is None else
               f"until {_clock(refusal.server_time_ms + refusal.retry_hint * 1000)}")
        return f"the pause lasts {end}; back by {back}"
    return f"back at {back}"


def _clock(ms: float) -> str:
    """A server time in ms as ``HH:MM:SS.mmmZ`` (UTC)."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _wait_so_far(run: WaitingRun, refusal: Refusal) -> Tuple[Optional[int], float]:
    """When the wait began (server ms; now, for a first refusal; None when the lock
    store was not reached) and how long it has lasted (seconds)."""
    now_ms = refusal.server_time_ms if refusal is not None else None
    since = run.since or now_ms
    return since, (now_ms - since) / 1000.0 if now_ms is not None and since else 0.0


def _countdown(policy: RetryPolicy, attempts: int, refusal: Refusal,
               promises: Dict[str, int], ceiling: Optional[float],
               recheck: Optional[float] = 1.0) -> Tuple[float, float]:
    """The countdown of a refused run, and how long it must wait at the least; a rate
    limit's promised start is added to ``promises``."""
    if isinstance(refusal, RateLimited):
        countdown = rate_countdown(refusal, recheck)
        promises[refusal.key] = refusal.promise
        return (countdown if ceiling is None else min(countdown, ceiling)), refusal.wait
    if isinstance(refusal, Paused):
        return policy.paused_countdown(refusal.retry_hint, ceiling), refusal.retry_hint or 0.0
    return policy.countdown(attempts, refusal, ceiling), 0.0


def rate_countdown(refusal: RateLimited, recheck: Optional[float] = 1.0) -> float:
    """The countdown of a run a rate limiter promised a start: back :data:`SHORT_WAIT`
    / 2 before it, or, far back in the line, sooner, to ask again after ``recheck``
    seconds at the least (None: never sooner; see :data:`RECHECK_SHARE`).

        >>> rate_countdown(RateLimited("k", "k", 0, 0.75, 0))
        0.5
        >>> rate_countdown(RateLimited("k", "k", 0, 30.0, 0, ahead=60))
        3.0
        >>> rate_countdown(RateLimited("k", "k", 0, 30.0, 0, ahead=60), None)
        29.75
    """
    early = max(0.0, refusal.wait - SHORT_WAIT / 2)
    if recheck is None:
        return early
    return min(early, max(recheck, refusal.wait * RECHECK_SHARE,
                          refusal.ahead / RECHECKS_PER_SECOND))


def _too_long(max_wait: float, waited: float, must_wait: float) -> bool:
    """Whether a run has waited, or would have to wait, ``max_wait`` seconds or more (a
    run that has not waited and need not wait never has)."""
    return not (waited + must_wait < max_wait or (waited <= 0 and must_wait <= 0))


def _give_up(task: Any, request: Any, plan: GiveUp, refusal: Refusal) -> NoReturn:
    """Raise :class:`LockWaitTimeout`."""
    max_wait, waited, must_wait = plan.max_wait, plan.waited, plan.must_wait
    more = f" and would wait {must_wait:.1f} s more" if must_wait else ""
    raise LockWaitTimeout(
        f"Task {task.name!r}[{request.id}] {describe(refusal, task)} and gave up: it "
        f"waited {waited:.1f} s{more}, beyond its max_wait of {max_wait} s"
    )


def _announce(task: Any, request: Any, refusal: Refusal, countdown: float) -> None:
    if isinstance(refusal, RateLimited):
        signals.rate_limited.send(sender=task, task_id=request.id, key=refusal.name,
                                  countdown=countdown, promise=refusal.promise)
    else:
        signals.lock_contended.send(sender=task, task_id=request.id,
                                    key=refusal.name if refusal else None,
                                    countdown=countdown, reason=describe(refusal, task))


def publish(signature: Any) -> None:
    """Publish ``signature``, trying again twice after a failure."""
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            signature.apply_async()
            return
        except Exception:
            if attempt == PUBLISH_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * 2 ** attempt)


def visibility_ceiling(task: Any) -> Optional[float]:
    options = task.app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT)
    if isinstance(timeout, (int, float)) and timeout > 0:
        return timeout * VISIBILITY_SHARE
    return None


def served(task: Any, request: Any, name: str) -> None:
    """Say (DEBUG) that this copy of a run ends unrun: its parked reference was served
    (another copy of its message ran it) in the line of limit ``name``. The history
    checker (``tests/history``) reads this line's arguments."""
    logger.debug("celery-redislock: task %s[%s]: %s of %r", task.name, request.id,
                 "served already", name)


@dataclass(frozen=True)
class Parked:
    """A run refused on the parking line: its reference ``ref`` was written; its copy,
    with the wait ``wait``, is to be published to ``ref``'s parking queue, then the
    original acknowledged (by the main process, see ``gate``; or by the pool process,
    see :mod:`.pool_park`)."""

    ref: broker_line.ParkRef
    wait: WaitingRun
    name: str


def parked(task: Any, request: Any, waited: WaitingRun, park: Park, server_ms: int) -> Parked:
    """The run of ``request``, its wait so far ``waited``, is to wait in the parking line
    of ``park.ref`` (said as a refusal is)."""
    wait = broker_line.parked_wait(waited, park.ref, server_ms or None)
    if is_rate_key(park.ref.key):  # said as on the old line: a rate refusal, not a slot's
        signals.rate_limited.send(sender=task, task_id=request.id, key=park.name,
                                  countdown=0.0, promise=None)
    else:
        signals.lock_contended.send(sender=task, task_id=request.id, key=park.name,
                                    countdown=0.0, reason=f"parked behind {park.name!r}")
    why = ("a later start of the rate %r is promised to it" if is_rate_key(park.ref.key)
           else "the slots of %r are taken")
    logger.log(logging.DEBUG if waited.parked else logging.INFO,
               "celery-redislock: task %s[%s] parked: " + why + "; it waits in their parking "
               "queue (attempt %d)", task.name, request.id, park.name, wait.attempts)
    return Parked(park.ref, wait, park.name)
