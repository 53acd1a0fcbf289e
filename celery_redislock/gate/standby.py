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
  reference for that holder, renews that lease and owes the next standby is sent
  without waiting (:func:`_take_slot`). So a chain of standbys passes one lease on from
  run to run, kept young by those renewals: a lease whose last renewal this process
  has not seen answered within a third of a lease (the store did not answer, or the
  holder was gone) is not handed so: the standby asks with the ended run's holder
  member instead (:data:`State.SWAPPING`), and one script moves the slot to it (never
  free, never two holders) and owes the next;
* none is: the slot is given back as any release (handed to the line), and a standby is
  asked for (:func:`~..engine.standby.ask_standby`, on the event loop, at most every
  :data:`ASK_EVERY` per key);
* the lease was handed on :data:`CHAIN_RUNS` times in a row: it is given back as any
  release even with a standby held (which waits for the next run of its key to end
  here), so that a chain does not keep a slot in one worker for good: the line's next
  run, moved, may start in another worker, which then holds standbys of its own.

A moved copy of such a line that arrives while this worker holds fewer standbys of its
key than :data:`HOLD_PER_RUN` per run of it that it runs asks with the standby's mark:
with no slot for it, it is held here (:func:`hold_here`) instead of parking again;
asked again after :data:`RECHECK` if no run of its key ended meanwhile, held at most
:data:`MAX_HOLDS` times in a row, and never past half the broker's
``visibility_timeout`` (:func:`~..line.waiting.visibility_ceiling`: a message left
unacknowledged longer is given back by kombu's Redis and SQS transports, a second copy
of the run); then it asks as any moved copy (it takes a reservation or parks again,
moved: a fresh message). A standby counts as held in the worker (:mod:`.room`: it
takes no pool process) and widens its prefetch window by one while it is held (as
Celery's held ETA tasks do), so that it never keeps the worker from taking and asking
about the messages behind it. A worker killed with a standby loses nothing (its message
is unacknowledged: the broker gives it back, and it asks as any moved copy) and runs
nothing twice (it holds no slot, and its one message is the run).

Each worker (its consumer) follows its copies' lives in one :class:`Standbys`: per
copy a :class:`Standby` in one :class:`State`, per key a :class:`Line`.

    >>> [state.name for state in State]
    ['ASKING', 'HELD', 'SWAPPING', 'AGAIN']
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional

from ..config.limit import TaskLimits
from ..config.settings import redis_client
from ..engine.parking import ParkAdmitCall
from ..engine.standby import (
    STANDBY_ASK,
    STANDBY_CLAIM,
    claim_args,
    is_standby,
    may_stand_by,
    standby_call,
    standby_moves,
)
from ..line import handoff
from ..line.waiting import Parked, visibility_ceiling
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

#: How many runs in a row one lease is handed on to at most (:data:`.hand_on.HANDED_ON`
#: counts them) before the end of the last gives it back to the store even with a
#: standby held here: a chain of standbys must not keep a slot in one worker for good.
#: Its release hands the slot to the line: the moved copy, taken by any worker, runs
#: there, and that worker then holds standbys of its own; while a chain keeps every slot,
#: the moved copies (standbys owed) that reach a worker running no run of the key find
#: no room there and park again, one after another.
CHAIN_RUNS = hand_on.HAND_ON_RUNS

#: At most one standby asked for per key per this many s by one worker.
ASK_EVERY = 0.05

#: The most copies, and runs per key, one worker follows: past it the oldest is
#: forgotten (a copy whose answer, or a run whose end, never came back here: its pool
#: process lost).
_KEPT = 1000

Handle = Callable[[Any], Any]
Publish = Callable[[Any], Any]


class Gate(NamedTuple):
    """What the gate lends this module: ``again(consumer, request, handle)`` gates a
    request anew; ``to_pool(consumer, request, handle, handed)`` sends it to the pool
    under the lease ``handed`` (a :meth:`~..engine.admission.Lease.handover` record)
    handed on to it; ``ask_now(consumer, request, handle)`` asks about it at once, a
    pool process being free for it (not behind the runs waiting for one)."""

    again: Callable[[Any, Any, Handle], Any]
    to_pool: Callable[[Any, Any, Handle, Dict[str, Any]], Any]
    ask_now: Callable[[Any, Any, Handle], Any]


class State(enum.Enum):
    """Where a moved copy is in its life as a standby of this worker.

    * ``ASKING``: it asked with the standby's mark (:func:`marked`); its answer holds it
      here (``HELD``), or it is forgotten (admitted, parked again...);
    * ``HELD``: held here for a run of its key to end here; then forgotten (it went to
      the pool under that run's lease), or ``SWAPPING`` (that lease too old to be handed
      on), or after :data:`RECHECK` ``AGAIN``;
    * ``SWAPPING``: to ask with the ended run's holder member; asked: ``ASKING``;
    * ``AGAIN``: it asks again (``ASKING``), or as any moved copy (forgotten).
    """

    ASKING = "asking"
    HELD = "held"
    SWAPPING = "swapping"
    AGAIN = "again"


def _unheld(request: Any) -> Any:
    """The handle of a copy not held yet (never called: only held copies are handed on)."""
    raise RuntimeError(f"standby {request.id} was never held")


@dataclass(eq=False)
class Standby:
    """One moved copy's life as a standby of semaphore ``key`` here: its ``state``,
    how many times in a row it was held (``holds``), the run and park id it asked with,
    (``SWAPPING``) the holder member whose slot it asks for, and when (monotonic) it first
    asked here (``since``: its message is unacknowledged from about then)."""

    key: str
    request: Any
    handle: Handle = _unheld
    state: State = State.ASKING
    holds: int = 0
    run: str = ""
    park_id: str = ""
    swap: Optional[str] = None
    since: float = field(default_factory=time.monotonic)


@dataclass
class Line:
    """One key's standbys in one worker: those held (oldest first), the runs sent to the
    pool whose release is this process's, and when a standby was last asked for."""

    held: Deque[Standby] = field(default_factory=deque)
    running: Dict[str, None] = field(default_factory=OrderedDict)
    asked_at: float = float("-inf")

    def has_room(self) -> bool:
        """Whether one more standby may be held (:data:`HOLD_PER_RUN` per run)."""
        return len(self.held) < HOLD_PER_RUN * len(self.running)


class Standbys:
    """One worker's standbys: each copy's :class:`Standby` by task id, each key's
    :class:`Line`."""

    __slots__ = ("copies", "lines")

    def __init__(self) -> None:
        self.copies: Dict[str, Standby] = OrderedDict()
        self.lines: Dict[str, Line] = {}

    def line(self, key: str) -> Line:
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = Line()
        return line

    def follow(self, standby: Standby) -> None:
        """Follow ``standby`` (its request's task id), the oldest forgotten past
        :data:`_KEPT`."""
        _bounded(self.copies, standby.request.id, standby)

    def forget(self, standby: Standby) -> None:
        self.copies.pop(standby.request.id, None)


def _bounded(entries: Dict[str, Any], task_id: str, value: Any) -> None:
    """``entries[task_id] = value``, dropping the oldest entry past :data:`_KEPT`."""
    entries[task_id] = value
    if len(entries) > _KEPT:
        entries.pop(next(iter(entries)))


#: Each worker's :class:`Standbys` where its consumer cannot keep them (``__slots__``).
_registry: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ATTRIBUTE = "_redislock_standbys"


def standbys_of(consumer: Any, make: bool = True) -> Optional[Standbys]:
    """``consumer``'s :class:`Standbys` (made on first use with ``make``, else None)."""
    mine = getattr(consumer, _ATTRIBUTE, None) or _registry.get(consumer)
    if mine is None and make:
        mine = _registry[consumer] = Standbys()
        with contextlib.suppress(AttributeError):
            setattr(consumer, _ATTRIBUTE, mine)
    return mine


def enabled(request: Any) -> bool:
    """Whether ``redislock_standby`` is set for ``request``'s task's app."""
    return task_settings(request.task).standby


def marked(consumer: Any, request: Any, call: Any) -> Any:
    """``call``, the admission of ``request``, with the standby's mark when it is a
    moved copy that may be held here or is to take an ended run's slot; else as is."""
    if not (isinstance(call, ParkAdmitCall) and may_stand_by(call) and enabled(request)):
        return call
    mine = standbys_of(consumer)
    assert mine is not None
    standby = mine.copies.get(request.id)
    swap = standby.swap if standby is not None and standby.state is State.SWAPPING else None
    if swap is None and not _may_hold(mine, call.keys[0], standby,
                                      visibility_ceiling(request.task)):
        if standby is not None:
            mine.forget(standby)
        return call
    standby = standby or Standby(call.keys[0], request)
    standby.state, standby.run, standby.swap = State.ASKING, str(call.args[3]), None
    mine.follow(standby)
    return standby_call(call, swap)


def _may_hold(mine: Standbys, key: str, standby: Optional[Standby],
              ceiling: Optional[float]) -> bool:
    """Whether a copy (``standby``: its life so far) may ask to be held as a standby of
    ``key`` here: room for it, fewer than :data:`MAX_HOLDS` holds so far, and one more
    :data:`RECHECK` held would end within ``ceiling`` (s) of its first ask (half the
    broker's visibility timeout; None: no timeout)."""
    if not mine.line(key).has_room():
        return False
    held_for = 0.0 if standby is None else time.monotonic() - standby.since
    if ceiling is not None and held_for + RECHECK > ceiling:
        return False
    return standby is None or standby.holds < MAX_HOLDS


def hold_here(consumer: Any, request: Any, handle: Handle, answer: Any, gate: Gate) -> bool:
    """Hold ``request`` as its key's standby when its admission's ``answer`` says so
    (True); else False."""
    mine = standbys_of(consumer, make=False)
    standby = mine.copies.get(request.id) if mine is not None else None
    if mine is None or standby is None or standby.state is not State.ASKING:
        return False
    if not (isinstance(answer, Parked) and is_standby(answer.ref.park_id)):
        mine.forget(standby)
        return False
    standby.state, standby.handle, standby.holds = State.HELD, handle, standby.holds + 1
    standby.key, standby.park_id = answer.ref.key, answer.ref.park_id
    mine.line(standby.key).held.append(standby)
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
    mine = standbys_of(consumer)
    assert mine is not None
    held = mine.line(standby.key).held
    if standby.state is State.HELD and standby in held:
        held.remove(standby)
        _prefetch(consumer, -1)
        standby.state = State.AGAIN
        mine.follow(standby)
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
    mine = standbys_of(consumer)
    assert mine is not None
    _bounded(mine.line(keys[0]).running, request.id, None)
    return functools.partial(_ended, consumer, request, store, keys[0], handed, gate)


def _ended(consumer: Any, request: Any, store: Any, key: str, handed: Dict[str, Any],
           gate: Gate) -> None:
    """A run that holds ``handed`` of ``key`` ended here: its slot goes to the standby
    held for ``key``, or back to the store (and a standby is asked for)."""
    mine = standbys_of(consumer)
    assert mine is not None
    line = mine.line(key)
    line.running.pop(request.id, None)
    yields = bool(line.held) and _chained_out(handed)
    standby = line.held.popleft() if line.held and not yields else None
    if standby is not None:
        _prefetch(consumer, -1)
        mine.forget(standby)
    publish = functools.partial(handoff.publish, request.task.app)
    if standby is not None and not standby.request.revoked():
        if _young(handed):  # to the pool process the run freed, as a slot handed on
            return _take_slot(consumer, store, key, standby, handed, gate, publish)
        if _swap(consumer, mine, standby, str(handed["member"]), gate):
            return None  # it asked with the ended run's slot
    if not store.give_back(handed, publish):
        logger.warning("celery-redislock: task %s[%s]: its slot could not be given back "
                       "here; it comes back when its lease ends", request.task.name,
                       request.id)
    if standby is not None and standby.request.revoked():  # it ends as a revoked request
        gate.again(consumer, standby.request, standby.handle)
    if not yields:  # a chain that yields still holds its standbys: none is asked for
        _ask(store, line, key, publish)
    return None


def _chained_out(handed: Dict[str, Any]) -> bool:
    """Whether the lease ``handed`` was handed on :data:`CHAIN_RUNS` times in a row
    (to standbys, or as :mod:`.hand_on` hands a slot on): it goes back to the store, not
    to a standby held here."""
    return hand_on.runs_handed_on(handed) >= CHAIN_RUNS


def _young(handed: Dict[str, Any]) -> bool:
    """Whether the lease ``handed`` was taken, or last renewed as this process saw
    answered, less than a third of a lease ago (a pool process adopts it without
    waiting, and renews it before it could end)."""
    age = time.monotonic() - float(handed.get("taken") or "-inf")
    return age < float(handed["lease"]) / 3


def _swap(consumer: Any, mine: Standbys, standby: Standby, member: str, gate: Gate) -> bool:
    """Have ``standby`` ask at once for the slot of holder ``member`` (a run that ended
    here, its lease too old to hand on): True when it asked so; False when its answer
    needed no store (the caller gives the slot back)."""
    standby.state, standby.swap = State.SWAPPING, member
    mine.follow(standby)
    gate.ask_now(consumer, standby.request, standby.handle)  # the process it freed
    if standby.state is State.SWAPPING:
        mine.forget(standby)
        return False
    return True


def _take_slot(consumer: Any, store: Any, key: str, standby: Standby, handed: Dict[str, Any],
               gate: Gate, publish: Publish) -> None:
    """Send ``standby`` to the pool under the ended run's lease ``handed``, and (without
    waiting) claim its reference for that holder, renew its lease and owe the next
    standby."""
    record = hand_on.handed_on(handed)
    hand_on.note(standby.request.id, record)
    args = claim_args(str(handed["member"]), standby.run, standby.park_id,
                      float(handed["lease"]))
    store.run_script(STANDBY_CLAIM, [key], args, functools.partial(
        _claimed, record, time.monotonic(), publish))
    gate.to_pool(consumer, standby.request, standby.handle, record)


def _claimed(record: Dict[str, Any], sent: float, publish: Publish, reply: Any) -> None:
    """The answer to :data:`STANDBY_CLAIM` for the lease ``record`` handed on, sent at
    ``sent`` (monotonic): claimed, the lease was renewed for a lease from then at least
    (the store applied it after), so it counts as taken then (see :func:`_young`); not
    (the holder gone, or no answer), it is never handed on again."""
    claimed = isinstance(reply, list) and bool(reply) and int(reply[0]) == 1
    record["taken"] = sent if claimed else float("-inf")
    _publish_moves(publish, 1, reply)


def _ask(store: Any, line: Line, key: str, publish: Publish) -> None:
    """Ask for a standby of ``key`` on the event loop (at most every :data:`ASK_EVERY`)."""
    now = time.monotonic()
    if now - line.asked_at < ASK_EVERY:
        return
    line.asked_at = now
    store.run_script(STANDBY_ASK, [key], [], functools.partial(_publish_moves, publish, 0))


def _publish_moves(publish: Publish, first: int, reply: Any) -> None:
    """Publish the moves a script's ``reply`` owes, from its element ``first`` on."""
    if isinstance(reply, list):
        moves = standby_moves(reply[first:])
        if moves:
            publish(moves)
