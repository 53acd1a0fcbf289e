"""The moves of the parking line in this process: a refused run's copy published to its
parking queue, and one parked message moved back per move owed, on this process's
:class:`~celery_redislock.parking.Mover` (a thread with its own broker connection, made
on first use; a pool process moves on its own, not through the main process).

* :func:`park` publishes a refused run's copy, then calls back (the gate acknowledges
  the original then, on its event loop: :func:`hop`);
* :func:`owe` moves one parked message per :class:`ParkedMove` a release or the poll
  reported (out of its sub-line's parking queue, for a fair line); a move that found
  its parking queue empty gives the reservation back (``moved_nothing``);
* :func:`leave_soon`: a moved copy that will not run leaves the line;
* :func:`claim`: a moved copy received by this worker drops its backup in the broker
  (kombu holds it from then on; see :mod:`celery_redislock.parking.redis_line`); the
  poll puts back the backups of copies no worker received in time.

    >>> moves_owed([ParkedMove("k")])
    [ParkedMove(key='k', sub='')]
    >>> moves_owed([b"!move 2 k"])  # a script's reply passed through as it came
    [ParkedMove(key='k', sub=''), ParkedMove(key='k', sub='')]
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional

from redis.exceptions import RedisError

from ..config.settings import read_settings, redis_client
from ..engine import parking as store
from ..engine.admission import ParkedMove, ParkRef, handoffs_of
from ..engine.refusal import describe_error
from ..engine.standby import StandbyMove
from ..parking import (
    Done,
    LoopHop,
    Mover,
    ParkedCopy,
    key_of_line,
    line_name,
    moved_copy,
    parking_queue,
)
from ..run.waiting_run import WaitingRun

logger = logging.getLogger(__name__)


_movers: Dict[int, Mover] = {}
_mover_apps: Dict[int, Any] = {}
_movers_lock = threading.Lock()


def mover(app: Any) -> Mover:
    """This process's mover for ``app`` (made and started on first use; a forked child
    makes its own). A process that moves for another app than before (an embedded
    worker after another, in tests) gets a new mover on that app's broker; the old one
    is stopped on a thread of its own, so that this call never waits for it."""
    pid = os.getpid()
    with _movers_lock:
        found = _movers.get(pid)
        if found is not None and _mover_apps.get(pid) is not app:
            threading.Thread(target=found.stop, kwargs={"timeout": 5.0},
                             name="redislock-mover-stop", daemon=True).start()
            found = None
        if found is None:
            found = _movers[pid] = Mover.for_app(app).start()
            _mover_apps[pid] = app
        return found


_hops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hop(hub: Any) -> LoopHop:
    """The way from the mover's thread to ``hub``'s event loop (one per hub)."""
    with _movers_lock:
        found = _hops.get(hub)
        if found is None:
            found = _hops[hub] = LoopHop(hub)
        return found


def park(app: Any, message: Any, ref: ParkRef, wait: WaitingRun,
         on_done: Callable[[Done], None]) -> bool:
    """Publish the parked copy of kombu ``message`` (its wait replaced by ``wait``) to
    ``ref.key``'s parking queue; ``on_done`` is called on the mover's thread. False: the
    mover did not take it (the caller keeps the original)."""
    copy = ParkedCopy.of(message, line_name(ref.key, ref.sub), wait.header())
    return mover(app).park(copy, on_done)


def moves_owed(handoffs: Iterable[Any]) -> List[ParkedMove]:
    """The moves owed among ``handoffs``: :class:`ParkedMove` entries, or a script's raw
    ``"!move <n> <key>"`` entries (the callers that pass a script's reply through:
    freeing a dead run's slots, an operator's wake)."""
    return [move for move in handoffs_of(list(handoffs)) if isinstance(move, ParkedMove)]


def owe(app: Any, moves: Iterable[ParkedMove]) -> None:
    """Move one parked message per move owed, on this process's mover (never waits)."""
    for move in moves:
        if not mover(app).move(parking_queue(line_name(move.key, move.sub)),
                               functools.partial(_moved, app, move.key,
                                                 isinstance(move, store.DeadlineMove),
                                                 sub=move.sub,
                                                 reserved=not isinstance(move, StandbyMove))):
            logger.warning("celery-redislock: the mover is full or stopped; the reservation "
                           "of %s lapses and the poll hands it over again", move.key)


def _moved(app: Any, key: str, late: bool, done: Done, tried: int = 0,
           sub: str = "", took: str = "", reserved: bool = True) -> None:
    """After a move (on the mover's thread): an empty parking queue gives the slot back
    (none was reserved for a deadline move, ``late``, nor for a standby's, not
    ``reserved``: that one gives back its sub-line's count only), and a sub-line ``sub``
    its count (its parked copy was not published yet: the poll owes the move again;
    see ``moved_nothing``). A move out
    of a fair line's own queue that found it empty (the lock store lost the sub-lines'
    counts: its moves are of anonymous entries) first tries the sub-lines the poll last
    saw holding messages, in turn (``tried`` of them so far; ``took``: the one this move
    was made from, which then counts one copy less: :func:`_took`)."""
    outcome = done.outcome
    if outcome is not None and outcome.done and took:
        _took(app, key, took)
    elif outcome is not None and not outcome.done and not late:
        line = None if sub else _sub_line_after_loss(key, tried)
        if line is not None and mover(app).move(
                parking_queue(line), functools.partial(_moved, app, key, late,
                                                       tried=tried + 1, took=line,
                                                       reserved=reserved)):
            return
        try:
            store.moved_nothing(redis_client(app, read_settings(app)), key, sub,
                                reserved=reserved)
        except RedisError as exc:  # an outage or a refusal: the reservation lapses instead
            logger.warning("celery-redislock: could not give back a reservation of %s (%s); "
                           "it lapses and the poll hands it over again", key,
                           describe_error(exc))
    elif done.error is not None:
        logger.warning("celery-redislock: a move out of the parking queue of %s failed "
                       "(%r); its reservation lapses and the poll hands it over again", key,
                       done.error)


def _took(app: Any, key: str, line: str) -> None:
    """A move owed from ``key``'s own queue took its message from its sub-line ``line``
    (a line name): that sub-line counts one copy less (else it could stay counted as
    waiting with nothing parked, and its next move find nothing)."""
    try:
        store.took_from_sub_line(redis_client(app, read_settings(app)), key,
                                 line[len(key_of_line(line)) + 1:])
    except RedisError as exc:  # its next empty move drops the count (moved_nothing)
        logger.warning("celery-redislock: could not count a copy less in %s (%s)", line,
                       describe_error(exc))


#: The sub-lines of fair lines that held messages at this process's last poll, by key.
_sub_lines: Dict[str, List[str]] = {}
_sub_turn = [0]


def _sub_line_after_loss(key: str, tried: int) -> Optional[str]:
    """The next sub-line of ``key`` to move from after ``tried`` empty ones, or None."""
    lines = _sub_lines.get(key)
    if not lines or tried >= len(lines):
        return None
    if tried == 0:
        _sub_turn[0] += 1
    return lines[(_sub_turn[0] + tried) % len(lines)]


def note_sub_lines(lines: Dict[str, int]) -> None:
    """Keep the fair lines' sub-lines holding messages, from a count by line name.

        >>> note_sub_lines({"k\x1fa": 2, "k\x1fb": 0, "j": 1}); _sub_lines
        {'k': ['k\\x1fa']}
    """
    found: Dict[str, List[str]] = {}
    for line, n in lines.items():
        if n > 0 and key_of_line(line) != line:
            found.setdefault(key_of_line(line), []).append(line)
    _sub_lines.clear()
    _sub_lines.update(found)


def claim(app: Any, headers: Any) -> bool:
    """A message with ``headers`` was received by this worker: if it is a copy moved out
    of a parking queue, its backup in the broker is dropped, on this process's mover
    (never waits). True if a claim was submitted.

    Only a copy as it was moved claims (not a later attempt that inherited its headers
    through ``self.retry()``); claiming twice is harmless (the second finds nothing)."""
    waited = WaitingRun.of_headers(headers)
    if not (waited.parked and waited.move.isalnum() and moved_copy(headers)):
        return False
    if not mover(app).claim(waited.move, _claimed):
        logger.warning("celery-redislock: the mover is full or stopped; the backup of a "
                       "moved copy is put back later and the lock store ends one of them")
        return False
    return True


def _claimed(done: Done) -> None:
    if done.error is not None:
        logger.warning("celery-redislock: a moved copy's backup could not be dropped (%r); "
                       "it is put back later and the lock store ends one of them",
                       done.error)


def leave_soon(app: Any, request: Any) -> None:
    """A copy moved out of a parking queue will not run (revoked, expired): its
    reference leaves the line and the reservation it was moved for is handed over again
    at once (on a short-lived thread: the caller is the event loop)."""
    waited = WaitingRun.of(request)
    if not waited.parked:
        return
    run = store.run_id(request.id, getattr(request, "retries", 0) or 0)
    threading.Thread(target=_leave, args=(app, ParkRef(waited.line, waited.park_id), run),
                     name="redislock-leave", daemon=True).start()


def _leave(app: Any, ref: ParkRef, run: str) -> None:
    try:
        owe(app, store.leave(redis_client(app, read_settings(app)), ref, run, moved=True))
    except Exception as exc:  # its reservation lapses, and the poll hands it over again
        logger.warning("celery-redislock: run %s could not leave the line of %s: %r", run,
                       ref.key, exc)


def stop_movers() -> None:
    """Stop this process's mover (the worker, or this pool process, shuts down)."""
    found = _movers.pop(os.getpid(), None)
    _mover_apps.pop(os.getpid(), None)
    if found is not None:
        found.stop(timeout=5.0)
