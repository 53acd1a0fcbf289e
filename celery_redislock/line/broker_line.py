"""The parking line's wiring (``redislock_line = "broker"``): the one place that uses the
lock store's references (:mod:`~celery_redislock.engine.parking`) and the broker's
parking queues (:mod:`.parking`) for the gate.

* :func:`parks` says whether a run waits on this line: the setting, a worker with an
  event loop (the gate's main process; without one the process that runs it parks it,
  :mod:`.pool_park`); a run whose limits lie in several hash slots of a Redis Cluster
  is sent back with a countdown (one copy, in no line), said once in the log;
* :func:`prepare` is the admission's one script (a moved copy asks with its
  :class:`ParkRef`);
* :func:`park` publishes a refused run's copy on this process's :class:`Mover`, then
  calls back (the gate acknowledges the original then, on its event loop);
* :func:`owe` moves one parked message per :class:`ParkedMove` a release or the poll
  reported (out of its sub-line's parking queue, for a fair line); a move that found
  its parking queue empty gives the reservation back (``moved_nothing``). A pool
  process moves on its own mover (a thread with its own broker connection, made on its
  first move), not through the main process;
* :class:`Poll`: each worker's main process asks the lock store every :data:`POLL`
  seconds for slots freed without a release (``due``) and moves what it owes; over more
  than :data:`POLL_KEYS` keys with a line, less often (:func:`pause_after`).

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
import time
import weakref
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set

from celery.apps.worker import Worker as CommandWorker
from celery.bootsteps import CLOSE, RUN, TERMINATE
from celery.signals import worker_init, worker_process_shutdown, worker_ready, worker_shutdown
from redis.exceptions import RedisError

from ..config.settings import Settings, read_settings, redis_client
from ..engine import parking as store
from ..engine import parking_rate
from ..engine.admission import ParkedMove, ParkRef, handoffs_of
from ..engine.refusal import describe_error
from ..errors import LockConfigurationError
from ..parking import (
    Done,
    LoopHop,
    Mover,
    ParkedCopy,
    broker_for,
    key_of_line,
    line_name,
    parked_lengths,
    parking_queue,
    recount,
)
from ..run.waiting_run import WaitingRun

logger = logging.getLogger(__name__)

__all__ = ["POLL", "POLL_KEYS", "ParkRef", "ParkedMove", "Poll", "hop", "leave_soon",
           "moves_owed", "owe", "park", "parked_ref", "parks", "pause_after", "prepare",
           "started"]

#: How often (s) each worker's main process asks the lock store for moves owed.
POLL = 0.2

#: How many keys with a parked line the poll visits per :data:`POLL` seconds, at most:
#: a poll over more waits longer before the next (:func:`pause_after`), so that the
#: lock store's and the broker's work while lines are parked stays bounded whatever the
#: number of keys (each key visited costs about 12 commands in the store, 2 in the
#: broker). Rate limits' lines are asked every :data:`POLL` s whatever the number of
#: keys: their runs start when the poll finds their promised start due.
POLL_KEYS = 100


def pause_after(keys: int) -> float:
    """How long (s) the poll waits before visiting the slots' lines of ``keys`` keys
    again: :data:`POLL` up to :data:`POLL_KEYS` keys, then in proportion (a slot freed
    without a release is handed over after up to that long).

        >>> pause_after(1), pause_after(100), pause_after(10_000)
        (0.2, 0.2, 20.0)
    """
    return max(POLL, POLL * keys / POLL_KEYS)

_said: Set[str] = set()


def parks(settings: Settings, client: Any, limiters: Sequence[Any], *, loop: bool,
          task_name: str, max_wait: Optional[float] = None) -> bool:
    """Whether a run of ``task_name`` under ``limiters`` waits on the parking line from
    the main process of a worker with an event loop (``loop``):
    semaphores and rate limits of any cost, all or nothing in one script (one rate limit
    of cost 1 alone: :mod:`..engine.parking_rate`, else ``lua/parked_rates.lua``), with
    their ``lock_max_wait`` kept (:mod:`.parked_deadline`). A run whose limits lie in
    several hash slots of a Redis Cluster (one script cannot decide them all at once)
    is sent back with a countdown instead, one copy, logged once per task."""
    if store.parks(client, limiters):
        return loop  # without an event loop, the process that runs it parks it
    say_no_park(task_name, "on Redis Cluster it parks runs whose limits lie in one hash "
                           "slot (one limit, or a semaphore and a rate of one name)")
    return False


def say_no_park(task_name: str, why: str) -> None:
    """Log once per task that its runs cannot park, and ``why``: a refused run is sent
    back with a countdown (one copy, in no line)."""
    if task_name not in _said:
        _said.add(task_name)
        logger.warning("celery-redislock: task %s cannot park its runs (%s): a refused run "
                       "is sent back with a countdown", task_name, why)


def prepare(client: Any, limiters: Sequence[Any], ask: store.ParkAsk) -> Optional[Any]:
    """The admission's one script for the run of ``ask`` (None: keep today's line). A
    paused semaphore parks the run too (one message, handed over once the pause ends),
    rather than sending it back with a countdown. A run of one rate limit whose start is
    within ``ask.book_ms`` is booked it (held here, no broker round trip), else it parks
    in the rate key's parking queue (:mod:`..engine.parking_rate`). Any other mix
    (semaphores and rate limits, several rates, a cost above 1) is decided all or nothing
    in one script (``lua/parked_rates.lua``): a far start parks the run at its rate's
    line, promised that start, and it holds no slot while it waits. ``ask.priority``
    (:func:`.priority.priority_of`): the band it waits in, higher first."""
    if parking_rate.rate_parks(client, limiters):
        return parking_rate.prepare_rate_admit(client, limiters, ask)
    return store.prepare_park_admit(client, limiters, replace(ask, park_paused=True))


def parked_ref(waited: WaitingRun) -> Optional[ParkRef]:
    """Where the copy carrying ``waited`` was parked (None: a copy never parked)."""
    return ParkRef(waited.line, waited.park_id) if waited.parked else None


def parked_wait(waited: WaitingRun, ref: ParkRef, since: Optional[int]) -> WaitingRun:
    """The wait a parked copy carries (version 2 of the header: its park id and line)."""
    return WaitingRun(since=waited.since or since, attempts=waited.attempts + 1,
                      park_id=ref.park_id, line=ref.key, carried=True)


def keep_served_ms(task: Any) -> int:
    """How long a served reference is kept (ms): as long as the broker may give back a
    copy of the run: its visibility timeout (kombu's default for Redis: one hour), with
    a margin for the transport's restore cycle."""
    options = task.app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return int(max(2 * timeout, timeout + 60) * 1000)
    return store.KEEP_SERVED_MS


def started(lease: Any) -> None:
    """Under default acks, the body of a moved copy starts: its reference is served."""
    store.started(lease)


def started_soon(lease: Any, on_error: Callable[[RedisError], None]) -> None:
    """:func:`started`, written now, its answer read later (see
    :func:`~..engine.parking.started_soon`): the body starts a round trip sooner."""
    store.started_soon(lease, on_error)


# --- the mover of this process -----------------------------------------------------------

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
                                                 sub=move.sub)):
            logger.warning("celery-redislock: the mover is full or stopped; the reservation "
                           "of %s lapses and the poll hands it over again", move.key)


def _moved(app: Any, key: str, late: bool, done: Done, tried: int = 0,
           sub: str = "") -> None:
    """After a move (on the mover's thread): an empty parking queue gives the slot back
    (none was reserved for a deadline move, ``late``), and a sub-line ``sub`` its turn
    (its parked copy was not published yet: the poll owes the move again). A move out
    of a fair line's own queue that found it empty (the lock store lost the sub-lines'
    counts: its moves are of anonymous entries) first tries the sub-lines the poll last
    saw holding messages, in turn (``tried`` of them so far)."""
    outcome = done.outcome
    if outcome is not None and not outcome.done and not late:
        line = None if sub else _sub_line_after_loss(key, tried)
        if line is not None and mover(app).move(
                parking_queue(line), functools.partial(_moved, app, key, late,
                                                       tried=tried + 1)):
            return
        try:
            store.moved_nothing(redis_client(app, read_settings(app)), key, sub)
        except RedisError as exc:  # an outage or a refusal: the reservation lapses instead
            logger.warning("celery-redislock: could not give back a reservation of %s (%s); "
                           "it lapses and the poll hands it over again", key,
                           describe_error(exc))
    elif done.error is not None:
        logger.warning("celery-redislock: a move out of the parking queue of %s failed "
                       "(%r); its reservation lapses and the poll hands it over again", key,
                       done.error)


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


# --- the poll ----------------------------------------------------------------------------

class Poll:
    """A thread of the worker's main process: every :data:`POLL` s, the moves owed for
    slots freed without a release (``due``), over the keys the lock store's index and
    the broker's registry of parking queues know (over more than :data:`POLL_KEYS`
    keys, every :func:`pause_after` s; the rate limits' lines in between). ``worker``:
    an embedded worker whose end ends the poll (it may never send ``worker_shutdown``);
    None: until stopped."""

    def __init__(self, app: Any, worker: Any = None) -> None:
        self.app = app
        self.worker = worker
        #: When (``time.monotonic()``) the next poll visits every line, not only rates'.
        self.next_visit = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redislock-poll", daemon=True)

    def start(self) -> Poll:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        connection = None
        while not self._stop.wait(POLL) and not _ended(self.worker):
            if not _running(self.worker):  # not started (or refused to start): no poll
                continue
            try:
                if connection is None:
                    connection = self.app.connection_for_write()
                self.once(broker_for(connection))
            except Exception as exc:
                logger.debug("celery-redislock: the parking line's poll failed: %r", exc)
                if connection is not None:
                    connection.collect()
                connection = None
        if connection is not None:
            connection.collect()

    def once(self, broker: Any) -> List[ParkedMove]:
        """One poll: the moves owed now, handed to the mover (before :attr:`next_visit`,
        only the rate limits' lines)."""
        settings = read_settings(self.app)  # as the app's runs read it (not at start)
        client, prefix = redis_client(self.app, settings), settings.prefix
        if time.monotonic() < self.next_visit:
            return self._rates_only(broker, client, prefix)
        counted = recount(broker)
        note_sub_lines(counted)
        lengths = by_key(counted, prefix)
        indexed = set(store.parked_keys(client, prefix)) - set(lengths)
        indexed |= set(parking_rate.rate_parked_keys(client, prefix)) - set(lengths)
        lengths.update(parked_lengths(broker, indexed))
        rates = {key: n for key, n in lengths.items() if parking_rate.is_rate_key(key)}
        slots = {key: n for key, n in lengths.items() if key not in rates}
        moves = store.due(client, slots, prefix=prefix) if slots else []
        if rates:  # rate limits' lines: the copies whose promised start is due
            moves += parking_rate.due_rate(client, rates, prefix=prefix)
        self.next_visit = time.monotonic() + pause_after(len(slots)) - POLL
        owe(self.app, moves)
        return moves

    def _rates_only(self, broker: Any, client: Any, prefix: str) -> List[ParkedMove]:
        """A poll between two visits of every line: the rate limits' lines only."""
        keys = parking_rate.rate_parked_keys(client, prefix)
        moves = parking_rate.due_rate(client, parked_lengths(broker, keys), prefix=prefix) \
            if keys else []
        owe(self.app, moves)
        return moves


def by_key(lines: Dict[str, int], prefix: str) -> Dict[str, int]:
    """The messages parked per semaphore key under ``prefix``, from those per line (a
    fair line's sub-lines summed: the store counts the line as a whole).

        >>> by_key({"p:k": 1, "p:k\x1fa": 2, "p:j\x1fb": 3, "q:k": 4}, "p:")
        {'p:k': 3, 'p:j': 3}
    """
    lengths: Dict[str, int] = {}
    for line, n in lines.items():
        key = key_of_line(line)
        if key.startswith(prefix):
            lengths[key] = lengths.get(key, 0) + n
    return lengths


_polls: Dict[int, Poll] = {}


def _ended(worker: Any) -> bool:
    """Whether embedded ``worker`` (None: none) has stopped or is stopping."""
    blueprint = getattr(worker, "blueprint", None)
    return blueprint is not None and blueprint.state in (CLOSE, TERMINATE)


def _running(worker: Any) -> bool:
    """Whether embedded ``worker`` runs (None: the command's worker, which does)."""
    return worker is None or getattr(getattr(worker, "blueprint", None), "state", None) == RUN


@worker_ready.connect
def _start_poll(sender: Any = None, worker: Any = None, **_: Any) -> None:
    """Start this process's poll for ``sender``'s app (``worker``: an embedded worker,
    whose poll replaces an earlier embedded worker's and ends with it)."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    found = _polls.get(os.getpid())
    if found is not None:
        if found.worker is None or found.worker is worker:
            return
        found.stop()
    _polls[os.getpid()] = Poll(app, worker).start()


@worker_init.connect
def _start_poll_embedded(sender: Any = None, **_: Any) -> None:
    """A worker embedded in a process (``celery.contrib.testing``'s ``start_worker``, the
    ``celery_worker`` fixture, a ``WorkController`` made by hand) never sends
    ``worker_ready``, which only the ``celery worker`` command's worker does: without
    this, nothing there would hand over slots freed without a release, nor give up a
    parked run past its ``lock_max_wait``."""
    if sender is None or isinstance(sender, CommandWorker):
        return
    try:
        _start_poll(sender, worker=sender)
    except LockConfigurationError:  # the worker's start check says so
        return


@worker_shutdown.connect
@worker_process_shutdown.connect
def _stop(**_: Any) -> None:
    poll = _polls.pop(os.getpid(), None)
    if poll is not None:
        poll.stop()
    found = _movers.pop(os.getpid(), None)
    _mover_apps.pop(os.getpid(), None)
    if found is not None:
        found.stop(timeout=5.0)
