"""What a run does after an admission: the decision alone, without doing it.

:func:`decide` turns the lock store's answer (an :data:`~..engine.admission.Outcome`, or
None when the store was not reached) and the run's :class:`Situation` into an
:data:`Action`. It reads no clock and calls neither Redis nor Celery: the worker's main
process (:mod:`.main_process`) and the pool process (:mod:`.pool_process`) call it,
then carry the action out: they alone end a waiting run (``Ignore``). How a run is sent
back (its countdown, its place in line), or gives up past its ``max_wait``, is decided
the same way, by :func:`~.waiting.plan_wait`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from ..engine.admission import Booked, Busy, Lease, Paused, RateLimited, Served, WouldAdmit

#: A run promised a start this close (seconds) waits for it in the worker process, and a
#: run sent back for a later start is sent back to arrive half of this early: the trip
#: through the broker and the worker (its delivery, the countdown held by the worker,
#: waiting for a free pool process) would otherwise make promised starts late, and a
#: start nobody is ready for is lost. Measured under a backlog (3 workers x 2 processes,
#: busy machine): with 0.1 s, 20/s and 50/s reached 0.83-0.86 and 0.64-0.69 of the ideal
#: rate, runs going round the broker arriving a median 0.6 s late; with 0.5 s, every rate
#: from 10/s to 100/s reached 0.98-1.0, every run waiting for its start here.
SHORT_WAIT = 0.5

#: How often (s) the worker's main process looks whether a pool process is free for the
#: runs it holds (a look at the worker's own state, no call to the lock store, made by
#: one timer per worker and only while runs are held).
ROOM_POLL = 0.002

#: Why a run was refused: a semaphore, a rate limit, a pause, or None when the lock
#: store did not answer.
Refusal = Union[Busy, RateLimited, Paused, None]


@dataclass(frozen=True)
class Situation:
    """What the decision needs to know about the run besides the outcome.

    ``eager``: run in the caller's thread (no queue to go back to); ``may_hold``: it may
    be held for a start due within ``short_wait`` seconds (the main process: not held
    too often yet; a pool process: slept fewer than twice); ``redelivered``: the broker
    delivered its message again, and this is its first answer here (an earlier run of
    the same task may still hold a slot).
    """

    eager: bool = False
    may_hold: bool = True
    short_wait: float = SHORT_WAIT
    redelivered: bool = False


@dataclass(frozen=True)
class Run:
    """Admitted: the run starts under ``lease`` (the main process hands it to the pool).
    ``look_for_earlier``: first look whether an earlier run of its task holds a slot."""

    lease: Lease
    look_for_earlier: bool = False


@dataclass(frozen=True)
class Hold:
    """Hold the run ``seconds`` where it is, then ask again (a pool process sleeps, the
    main process keeps it on its timer): for the start ``promise`` (rate key, start µs)
    a rate limiter promised it; or, ``probed``, it would be admitted but no pool process
    is free; or until the start ``booked`` for it, then start it without asking."""

    seconds: float
    promise: Optional[Tuple[str, int]] = None
    probed: bool = False
    booked: Optional[Booked] = None
    look_for_earlier: bool = False


@dataclass(frozen=True)
class SendBack:
    """Re-publish the run to wait for ``refusal`` (with a countdown, in line for a
    semaphore; it may give up instead, past its ``max_wait``: see
    :func:`~.waiting.plan_wait`), and end this copy without running it."""

    refusal: Refusal
    look_for_earlier: bool = False


@dataclass(frozen=True)
class WaitHere:
    """An eager run that was refused waits in the caller's thread for ``refusal`` to pass."""

    refusal: Refusal


@dataclass(frozen=True)
class End:
    """End this copy of the run without running it: ``served`` (another copy of its
    message ran it, or this parked copy is stale), for limit ``name``."""

    why: str
    name: str


@dataclass(frozen=True)
class Park:
    """The parking line (``redislock_line = "broker"``): the refusal by limit ``name``
    wrote the run's reference (``ref``: the semaphore key and the park id); publish its
    copy to that key's parking queue, then acknowledge the original, never before."""

    ref: Any
    name: str


#: What a run does after an admission.
Action = Union[Run, Hold, SendBack, WaitHere, End, Park]


def decide(outcome: Any, situation: Situation = Situation()) -> Action:
    """The action for a run whose admission answered ``outcome`` (None: the lock store did
    not answer; it is sent back, fail-closed).

        >>> from celery_redislock.engine.admission import Served, RateLimited
        >>> decide(Served(name="crawl", server_time_ms=0))
        End(why='served', name='crawl')
        >>> decide(RateLimited("r", "k", promise=7, wait=0.2, server_time_ms=0))
        Hold(seconds=0.2, promise=('k', 7), probed=False, booked=None, look_for_earlier=False)
        >>> type(decide(RateLimited("r", "k", promise=7, wait=3.0, server_time_ms=0)))
        <class 'celery_redislock.run.decide.SendBack'>
        >>> decide(None)
        SendBack(refusal=None, look_for_earlier=False)
        >>> from celery_redislock.engine.admission import Busy, ParkRef
        >>> decide(Busy(name="crawl", holders=1, slots=1, retry_hint=None,
        ...             average_hold=None, server_time_ms=0, park=ParkRef("k", "7:1")))
        Park(ref=ParkRef(key='k', park_id='7:1', sub=''), name='crawl')
    """
    if isinstance(outcome, WouldAdmit):
        return Hold(ROOM_POLL, probed=True)
    if isinstance(outcome, Booked):
        return Hold(outcome.wait, booked=outcome)
    ended = _ended(outcome)
    if ended is not None:
        return ended
    if isinstance(outcome, Busy) and outcome.park is not None and not situation.eager:
        return Park(outcome.park, outcome.name)
    look = situation.redelivered and not situation.eager and outcome is not None
    if _holds_for_start(outcome, situation):
        return Hold(outcome.wait, promise=(outcome.key, outcome.promise),
                    look_for_earlier=look)
    if isinstance(outcome, Lease):
        return Run(outcome, look_for_earlier=look)
    if situation.eager:
        return WaitHere(outcome)
    return SendBack(outcome, look_for_earlier=look)


def _ended(outcome: Any) -> Optional[End]:
    """Another copy of this run's message ran it (or this parked copy is stale)."""
    if isinstance(outcome, Served):
        return End("served", outcome.name)
    return None


def _holds_for_start(outcome: Any, situation: Situation) -> bool:
    """A start promised soon enough to wait for here rather than going round the broker."""
    return (isinstance(outcome, RateLimited) and not situation.eager and situation.may_hold
            and outcome.wait <= situation.short_wait)
