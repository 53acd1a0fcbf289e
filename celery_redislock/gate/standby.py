"""Standbys in the worker's main process: the next run of a parked line held here with
no slot, handed the slot of a run of the same key that ends here (``redislock_standby``;
the lock store's side: :mod:`~..engine.standby`).

A slot handed over through the parking line idles for the chain of hops between a
run's end and the next run's start: the release, the mover's move, the broker, a worker
receiving the moved copy, its admission, the pool. With standbys, a run of a parked
line (one semaphore of cost 1, no rate, no max wait) that this worker sends to the pool
leaves its release to this process (:func:`release_for`). When it ends:

* a standby of its key is held here: the standby goes at once to the pool process the
  run freed, under the ended run's lease, as a slot handed on does (:mod:`.hand_on`:
  the store sees one holder throughout), and the script that claims the standby's
  reference for that holder and owes the next standby is sent without waiting
  (:func:`_take_slot`). A lease older than a third of a lease is not handed so: the
  standby asks with the ended run's holder member instead (:func:`marked`), and one
  script moves the slot to it (never free, never two holders) and owes the next;
* none is: the slot is given back as any release (handed to the line), and a standby is
  asked for (:func:`~..engine.standby.ask_standby`, on the event loop, at most every
  :data:`ASK_EVERY`).

A moved copy of such a line that arrives while this worker holds fewer standbys of its
key than :data:`HOLD_PER_RUN` per run of it that it runs asks with the standby's mark:
with no slot for it, it is held here (:func:`hold_here`) instead of parking again;
asked again after :data:`RECHECK` if no run of its key ended meanwhile, held at most
:data:`MAX_HOLDS` times in a row, then it asks as any moved copy (it takes a
reservation or parks again). A standby counts as held in the worker (:mod:`.room`: it
takes no pool process) and widens its prefetch window by one while it is held (as
Celery's held ETA tasks do), so that it never keeps the worker from taking and asking
about the messages behind it. A worker killed with a standby loses nothing (its message
is unacknowledged: the broker gives it back, and it asks as any moved copy) and runs
nothing twice (it holds no slot, and its one message is the run).

    >>> Standby.__slots__
    ('handle', 'holds', 'key', 'park_id', 'request', 'run')
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set

from ..config.limit import TaskLimits
from ..config.settings import redis_client
from ..engine.admission import handoffs_of
from ..engine.parking import ParkAdmitCall
from ..engine.standby import (
    STANDBY_ASK,
    STANDBY_CLAIM,
    claim_args,
    is_standby,
    may_stand_by,
    standby_call,
)
from ..line import handoff
from ..line.waiting import Parked
from ..run.limited import limits_of, task_settings
from . import hand_on, room
from .hub_store import hub_store
from .main_process import MAIN_PROCESS_TIMEOUT

logger = logging.getLogger(__name__)

#: How long (s) a standby is held before it asks again (a run of its key ended here
#: meanwhile hands it its slot at once).
RECHECK = 1.0

#: How many times in a row a copy is held as a standby at the most; then it asks as any
#: moved copy (this worker's runs of its key may have stopped ending).
MAX_HOLDS = 5

#: How many standbys of a key a worker holds at most per run of that key it runs: a
#: standby owed lands in whichever worker takes its moved copy, and one that finds no
#: room parks again (a publish, and a receipt more); two per run leave room for the
#: ones on their way (fair order: the standbys are taken in turn, so a tenant that
#: starts waiting waits behind at most this many per global slot more).
HOLD_PER_RUN = 2

#: At most one standby asked for per key per this many s by one worker.
ASK_EVERY = 0.05

#: The most entries the bookkeeping below keeps (the ids of runs whose end or answer
#: never came back here, a pool process lost: dropped past it).
_KEPT = 1000

Handle = Callable[[Any], Any]


class Gate(NamedTuple):
    """What the gate lends this module: ``again(consumer, request, handle)`` gates a
    request anew; ``to_pool(consumer, request, handle, handed)`` sends it to the pool
    under the lease ``handed`` (a :meth:`~..engine.admission.Lease.handover` record)
    handed on to it; ``ask_now(consumer, request, handle)`` asks about it at once, a
    pool process being free for it (not behind the runs waiting for one)."""

    again: Callable[[Any, Any, Handle], Any]
    to_pool: Callable[[Any, Any, Handle, Dict[str, Any]], Any]
    ask_now: Callable[[Any, Any, Handle], Any]


class Standby:
    """A copy held here as the standby of semaphore ``key``: its run and park id."""

    __slots__ = ("handle", "holds", "key", "park_id", "request", "run")

    def __init__(self, key: str, request: Any, handle: Handle, holds: int, run: str,
                 park_id: str) -> None:
        self.key, self.request, self.handle, self.holds = key, request, handle, holds
        self.run, self.park_id = run, park_id


#: The standbys held for each key, oldest first (at most :data:`HOLD_PER_RUN` per run of
#: the key running here, but asks on their way may add one more).
_held: Dict[str, List[Standby]] = {}
#: Per key, the task ids of runs sent to the pool whose release is this process's.
_running: Dict[str, Set[str]] = {}
#: Task id -> the holder member whose slot the standby's next ask takes.
_swaps: Dict[str, str] = {}
#: Task id -> how many times in a row a standby asking again was held (until its answer).
_holds: Dict[str, int] = {}
#: Task id -> the run ('<task id>:<attempt>') of a copy that asked with the mark.
_asks: Dict[str, str] = {}
#: Key -> when a standby was last asked for (monotonic).
_asked: Dict[str, float] = {}


def _keep(entries: Dict[str, Any], task_id: str, value: Any) -> None:
    if len(entries) >= _KEPT:
        entries.clear()
    entries[task_id] = value


def enabled(request: Any) -> bool:
    """Whether ``redislock_standby`` is set for ``request``'s task's app."""
    return task_settings(request.task).standby


def marked(request: Any, call: Any) -> Any:
    """``call``, the admission of ``request``, with the standby's mark when it is a
    moved copy that may be held here or is to take an ended run's slot; else as is."""
    if not isinstance(call, ParkAdmitCall) or not may_stand_by(call):
        return call
    swap = _swaps.pop(request.id, None)
    key = call.keys[0]
    if swap is None and (len(_held.get(key) or ()) >= HOLD_PER_RUN * len(_running.get(key) or ())
                         or _holds.get(request.id, 0) >= MAX_HOLDS or not enabled(request)):
        return call
    _keep(_asks, request.id, str(call.args[3]))
    return standby_call(call, swap)


def hold_here(consumer: Any, request: Any, handle: Handle, answer: Any, gate: Gate) -> bool:
    """Hold ``request`` as its key's standby when its admission's ``answer`` says so
    (True); else False."""
    holds = _holds.pop(request.id, 0) + 1 if _holds else 1
    run = _asks.pop(request.id, None) if _asks else None
    if not (isinstance(answer, Parked) and is_standby(answer.ref.park_id)) or run is None:
        return False
    standby = Standby(answer.ref.key, request, handle, holds, run, answer.ref.park_id)
    _held.setdefault(standby.key, []).append(standby)
    with room.held_lock:  # held here: it takes no pool process (room.capacity)
        room.held[request] = room.hold_of(request, limits_of(request.task))
    _prefetch(consumer, +1)
    consumer.timer.call_after(RECHECK, _recheck, (consumer, standby, gate), priority=6)
    return True


def _prefetch(consumer: Any, change: int) -> None:
    """The consumer's prefetch window widened (+1) while a standby is held, narrowed
    (-1) once it is not: a standby is an unacknowledged message that waits here, as
    Celery's held ETA tasks are, and must not keep the worker from taking the messages
    behind it (newcomers to park, other tenants' runs)."""
    qos = getattr(consumer, "qos", None)
    if qos is not None:
        (qos.increment_eventually if change > 0 else qos.decrement_eventually)()


def _recheck(consumer: Any, standby: Standby, gate: Gate) -> None:
    """A standby held :data:`RECHECK` with no run of its key ended here: it asks again."""
    held = _held.get(standby.key)
    if held and standby in held:
        held.remove(standby)
        _prefetch(consumer, -1)
        _keep(_holds, standby.request.id, standby.holds)
        gate.again(consumer, standby.request, standby.handle)


def release_for(consumer: Any, request: Any, limits: TaskLimits, handed: Dict[str, Any],
                gate: Gate) -> Optional[Callable[[], None]]:
    """The release of ``request``'s contended lease ``handed`` by this process at the
    run's end, handing its slot to a standby (see the module), or None: not so (the
    pool process releases)."""
    keys: List[str] = list(handed.get("keys") or ())
    if (len(keys) != 1 or handed.get("parts") or any(int(c) != 1 for c in handed.get("costs")
                                                    or ()) or not enabled(request)):
        return None
    settings = task_settings(request.task)
    if settings.gate != "async":
        return None
    store = hub_store(consumer, redis_client(request.task._get_app(), settings),
                      MAIN_PROCESS_TIMEOUT)
    if store is None:
        return None
    running = _running.setdefault(keys[0], set())
    if len(running) >= _KEPT:
        running.clear()
    running.add(request.id)
    return functools.partial(_ended, consumer, request, store, keys[0], handed, gate)


def _ended(consumer: Any, request: Any, store: Any, key: str, handed: Dict[str, Any],
           gate: Gate) -> None:
    """A run that holds ``handed`` of ``key`` ended here: its slot goes to the standby
    held for ``key``, or back to the store (and a standby is asked for)."""
    running = _running.get(key)
    if running is not None:
        running.discard(request.id)
    held = _held.get(key)
    standby = held.pop(0) if held else None
    if standby is not None:
        _prefetch(consumer, -1)
    publish = functools.partial(handoff.publish, request.task.app)
    if standby is not None and not standby.request.revoked():
        if _young(handed):  # to the pool process the run freed, as a slot handed on
            return _take_slot(consumer, store, key, standby, handed, gate, publish)
        _swaps[standby.request.id] = str(handed["member"])
        gate.ask_now(consumer, standby.request, standby.handle)  # the process it freed
        if _swaps.pop(standby.request.id, None) is None:
            return None  # it asked with the ended run's slot
    if not store.give_back(handed, publish):
        logger.warning("celery-redislock: task %s[%s]: its slot could not be given back "
                       "here; it comes back when its lease ends", request.task.name,
                       request.id)
    if standby is not None and standby.request.revoked():  # it ends as a revoked request
        gate.again(consumer, standby.request, standby.handle)
    _ask(store, key, publish)
    return None


def _young(handed: Dict[str, Any]) -> bool:
    """Whether the lease ``handed`` is younger than a third of a lease (a pool process
    adopts it without waiting, and renews it before it could end)."""
    age = time.monotonic() - float(handed.get("taken") or "-inf")
    return age < float(handed["lease"]) / 3


def _take_slot(consumer: Any, store: Any, key: str, standby: Standby, handed: Dict[str, Any],
               gate: Gate, publish: Callable[[Any], Any]) -> None:
    """Send ``standby`` to the pool under the ended run's lease ``handed``, and (without
    waiting) claim its reference for that holder and owe the next standby."""
    record = hand_on.handed_on(handed)
    hand_on.note(standby.request.id, record)

    def replied(reply: Any) -> None:
        if isinstance(reply, list):
            moves = handoffs_of(reply[1:])
            if moves:
                publish(moves)

    store.run_script(STANDBY_CLAIM, [key],
                     claim_args(str(handed["member"]), standby.run, standby.park_id), replied)
    gate.to_pool(consumer, standby.request, standby.handle, record)


def _ask(store: Any, key: str, publish: Callable[[Any], Any]) -> None:
    """Ask for a standby of ``key`` on the event loop (at most every :data:`ASK_EVERY`)."""
    now = time.monotonic()
    if now - _asked.get(key, float("-inf")) < ASK_EVERY:
        return
    _asked[key] = now

    def replied(reply: Any) -> None:
        if isinstance(reply, list):
            moves = handoffs_of(reply)
            if moves:
                publish(moves)

    store.run_script(STANDBY_ASK, [key], [], replied)
