"""The worker's main process's room: the requests it holds for a free pool process.

One first-come first-served queue per worker (its consumer), served by one timer every
:data:`~..run.decide.ROOM_POLL` seconds while it holds requests, and at once by the end
of every run the main process handed to the pool (:func:`serve_now`); the requests held
on the timer for a promised start (:func:`hold_back`); and the *look-ahead*: while a
task's key has slots to spare, as many runs as the pool has processes are asked for
before a process is free for them (:func:`lookahead`).

A held request takes no pool process: it does not count when the gate looks for room
(:func:`free_processes`). What gates a request again (``again``) is the gate's own entry,
passed in by :mod:`.gate`, so that this module knows nothing of the admission.

    >>> Hold().may_wait_unprobed()
    True
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from celery.worker import state as worker_state

from ..config.limit import TaskLimits
from ..engine.admission import Booked
from ..run.decide import ROOM_POLL
from ..run.limited import task_settings
from ..run.waiting_run import carries_wait

#: How a request goes to the pool: the handler Celery's strategy gave it.
Handle = Callable[[Any], Any]
#: A request held here: the request, its handler, what is known of its hold.
Entry = Tuple[Any, Handle, "Hold"]
#: Gates a request again: ``again(consumer, request, handle)``.
Again = Callable[[Any, Any, Handle], Any]


#: How long (s) a run may wait in the main process for a free pool process before its
#: limits are probed (a run that would be refused is then sent back at once, instead of
#: waiting here for a process only to be refused): short waits, as when a pool runs
#: short tasks back to back, cost no call to the lock store.
PROBE_AFTER = 0.25


class Hold:
    """What the main process knows of a request it holds back."""

    __slots__ = ("booked", "copy", "due", "limits", "probed", "promises", "since", "waits")

    def __init__(self, copy: bool = False, limits: Optional[TaskLimits] = None) -> None:
        #: Whether the request is a copy of a waiting run's message (see
        #: :func:`~..run.waiting_run.carries_wait`), and the limits it runs under: read
        #: once, as it is first gated.
        self.copy, self.limits = copy, limits
        self.promises: dict = {}
        self.waits = 0
        self.probed = False
        self.since = time.monotonic()
        #: The start booked for the run, and when (monotonic) it is due.
        self.booked: Optional[Booked] = None
        self.due = 0.0

    def may_wait_unprobed(self) -> bool:
        """Whether, with no pool process free, the run waits for one without a probe."""
        return self.probed or time.monotonic() - self.since < PROBE_AFTER


#: Requests held back in the worker's main process (on its timer), which take no pool
#: process: they do not count when the gate looks for room. (The timer may be a thread of
#: its own, beside the consumer's: hence the lock.)
held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
held_lock = threading.Lock()


def unhold(request: Any) -> Optional[Hold]:
    """Take ``request`` out of the held ones: what was known of it, if it was held."""
    with held_lock:
        return held.pop(request, None)


class Room:
    """A worker's requests held until a pool process is free for them (unasked, or
    probed and admissible), in the order they came; and whether the one timer that
    serves them is set."""

    __slots__ = ("queue", "served", "spares", "thread", "timer_set")

    def __init__(self) -> None:
        self.queue: Deque[Entry] = deque()
        self.timer_set = False
        #: When (monotonic) the end of a run last served the queue (see
        #: :data:`ROOM_POLL_SERVED`).
        self.served = 0.0
        #: The leases of runs that ended when no run waited here, kept for the next
        #: runs of their limits (a :class:`~.kept_leases.Spares`, made on first use).
        self.spares: Any = None
        #: The thread that made the queue (the worker's consumer), which serves it.
        self.thread = threading.get_ident()


#: Each worker's (consumer's) queue of requests waiting for a free pool process.
rooms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: Per task name: whether this worker's last admission of one of its runs found slots
#: to spare and no line (nor took the last free slot), on a worker that looks ahead
#: (see :func:`lookahead`): its next runs may then be asked for before a pool process
#: is free for them.
spare: Dict[str, bool] = {}


def lookahead(consumer: Any) -> int:
    """How many runs beyond its free pool processes a worker asks for while their key
    has slots to spare (``redislock_gate = "async"``, prefork pool: as many as it has
    processes), so that a process that ends a run finds the next one admitted, instead
    of idling for the round trip of its admission. The run waits for the process in the
    pool's own buffer, as a plain task's does; a run asked for so that finds a line, or
    takes the last free slot, while no process is free gives its slot back at once and
    waits here (a slot is never held idle while another run waits for it)."""
    pool = getattr(consumer, "pool", None)
    if not _looks_ahead(consumer, pool):
        return 0
    return int(getattr(pool, "num_processes", None) or 0)


def _looks_ahead(consumer: Any, pool: Any) -> bool:
    """Whether ``consumer``'s worker looks ahead at all (see :func:`lookahead`): a
    prefork pool, on an event loop."""
    kind = type(pool)
    prefork = _prefork.get(kind)
    if prefork is None:
        prefork = _prefork[kind] = kind.__module__.endswith("prefork")
    return prefork and getattr(consumer, "hub", None) is not None


#: Per pool class: whether it is Celery's prefork pool (see :func:`lookahead`).
_prefork: Dict[type, bool] = {}


def hold_of(request: Any, limits: Optional[TaskLimits]) -> Hold:
    """The hold of ``request``, a run under ``limits`` gated for the first time."""
    return Hold(carries_wait(getattr(getattr(request, "message", None), "headers", None)),
                limits)


def may_go_ahead(request: Any, hold: Hold) -> bool:
    """Whether ``request`` (held as ``hold`` says) may be asked for ahead of a free pool
    process: its task's key had slots to spare at its last admission here, and it is a
    newcomer (a copy of a waiting or parked run, which may claim a reservation, never
    gives it back unused)."""
    return not hold.copy and spare.get(request.task.name, False)


def note_spare(consumer: Any, task: Any, limits: TaskLimits, answer: Any) -> bool:
    """Record whether ``answer`` (an admission of a run of ``task``) leaves slots to
    spare for its next runs to be asked for ahead (see :data:`spare`); returns it."""
    found = (isinstance(answer, dict) and not answer.get("contended")
             and not answer.get("last") and not answer.get("parts")
             and all(rule.rate is None for rule in limits.rules)
             and task_settings(task).gate == "async" and lookahead(consumer) > 0)
    spare[task.name] = found
    return found


def serve_now(consumer: Any, again: Again) -> None:
    """Gate the requests at the head of ``consumer``'s queue that the free pool
    processes can take now, when called in the thread that serves the queue (a pool
    may report a run's end from a thread of its own: the queue's timer serves then)."""
    room = getattr(consumer, ROOM_ATTRIBUTE, None) or room_of(consumer)
    if room is None or room.thread != threading.get_ident():
        return
    room.served = time.monotonic()
    if not room.queue:
        return
    with held_lock:
        taken = take_from(consumer, room)
    for request, handle, _ in taken:
        again(consumer, request, handle)


def hold_back(consumer: Any, request: Any, handle: Handle, hold: Hold, seconds: float,
              again: Again) -> None:
    """Ask about ``request`` again in ``seconds``; meanwhile it stays reserved by this
    worker (its message unacknowledged, as Celery's ``rate_limit`` holds a request)."""
    with held_lock:
        held[request] = hold
    consumer.timer.call_after(max(seconds, 0.001), again, (consumer, request, handle),
                              priority=6)


def wait_for_room(consumer: Any, request: Any, handle: Handle, hold: Hold,
                  again: Again) -> None:
    """Hold ``request`` at the end of its worker's queue of requests waiting for a free
    pool process, and set the timer that serves that queue."""
    with held_lock:
        room = _enqueue(consumer, request, handle, hold)
    if room is not None:
        _serve_later(consumer, room, again)


#: Where :func:`place` sends a run: to the pool now, asked for ahead of a free process,
#: or asked (probed) with none free.
NOW, AHEAD, PROBE = "now", "ahead", "probe"


def place(consumer: Any, request: Any, handle: Handle, hold: Hold, loop: bool,
          again: Again) -> Optional[str]:
    """Where ``request`` (gated, not revoked, held as ``hold``) goes from the gate: a
    pool process is free for it (:data:`NOW`); none is, but it may be asked for ahead
    of one (:data:`AHEAD`, see :func:`lookahead`); none is, and it has waited
    :data:`PROBE_AFTER` (:data:`PROBE`: asked, probed). Else it waits here for a free
    process, at the end of the queue (None; see :func:`wait_for_room`), as it does at
    once on a worker with an event loop (``loop``: on the parking line its admission
    parks the run it refuses, so it is never probed). One look at the pool, under one
    taking of the held requests' lock."""
    with held_lock:
        free, ahead = capacity(consumer)
        if free >= 0:
            return NOW
        if free >= -ahead and may_go_ahead(request, hold):
            return AHEAD
        if not loop and not hold.may_wait_unprobed():
            return PROBE
        room = _enqueue(consumer, request, handle, hold)
    if room is not None:
        _serve_later(consumer, room, again)
    return None


def _enqueue(consumer: Any, request: Any, handle: Handle, hold: Hold) -> Optional[Room]:
    """Hold ``request`` at the end of its worker's queue; its room, when the timer that
    serves it is to be set (None: it is set). Called with the held requests' lock."""
    held[request] = hold
    room = getattr(consumer, ROOM_ATTRIBUTE, None) or room_of(consumer)
    if room is None:
        room = new_room(consumer)
    room.queue.append((request, handle, hold))
    if room.timer_set:
        return None
    room.timer_set = True
    return room


def room_of(consumer: Any) -> Optional[Room]:
    """``consumer``'s room, if it has one: the worker's own, read from the consumer
    itself (an attribute; :data:`rooms` is the registry, a weak dictionary whose look-up
    is Python code, made several times a run)."""
    room = getattr(consumer, ROOM_ATTRIBUTE, None)
    if room is not None:
        return room  # type: ignore[no-any-return]
    return rooms.get(consumer)  # type: ignore[no-any-return]


#: The attribute of a worker's consumer that holds its room (see :func:`room_of`).
ROOM_ATTRIBUTE = "_redislock_room"


def new_room(consumer: Any) -> Room:
    """A new room for ``consumer``, registered and, where it can be, kept on it."""
    room = rooms[consumer] = Room()
    with contextlib.suppress(AttributeError):  # a consumer with __slots__: the registry
        setattr(consumer, ROOM_ATTRIBUTE, room)
    return room


#: How often (s) the queue's timer looks while the ends of runs the main process handed
#: to the pool serve the queue (one did within as long): each end takes from the queue
#: what the pool processes free, so the timer only catches a process freed otherwise (a
#: plain task's end, a process lost), and looking every :data:`~.decide.ROOM_POLL` cost
#: the main process a timer entry per run or so.
ROOM_POLL_SERVED = 0.01


def _serve_later(consumer: Any, room: Room, again: Again) -> None:
    """Set the timer that serves ``room``: in :data:`~.decide.ROOM_POLL`, or in
    :data:`ROOM_POLL_SERVED` while the ends of runs serve it."""
    served = time.monotonic() - room.served < ROOM_POLL_SERVED
    consumer.timer.call_after(ROOM_POLL_SERVED if served else ROOM_POLL, _serve,
                              (consumer, room, again), priority=6)


def _serve(consumer: Any, room: Room, again: Again) -> None:
    """Gate again, from the head of the queue, as many held requests as there are free
    pool processes; come back in :data:`~.decide.ROOM_POLL` while any are left (in
    :data:`ROOM_POLL_SERVED` while the ends of runs serve the queue). The runs due for
    a probe are taken too, but not on a worker with an event loop, where no run is
    probed (see :func:`place`): there a run that waited :data:`PROBE_AFTER` would only
    be gated again and queued anew at the back, a turn of the queue per timer tick."""
    with held_lock:
        taken = take_from(consumer, room)
        if getattr(consumer, "hub", None) is None:
            taken += _due_for_a_probe(room)
    for request, handle, _ in taken:
        again(consumer, request, handle)
    with held_lock:
        if not room.queue:
            room.timer_set = False
            return
    _serve_later(consumer, room, again)


def take_from(consumer: Any, room: Room) -> List[Entry]:
    """Take from the head of ``room`` the requests that the free pool processes can
    take now, and, while their task's key has slots to spare, as many more as the
    worker looks ahead (see :func:`lookahead`). Called with the held requests' lock."""
    free, ahead = capacity(consumer)
    taken = []
    while room.queue:
        if free <= 0:
            request, _, hold = room.queue[0]
            if free <= -ahead or not may_go_ahead(request, hold):
                break
        taken.append(room.queue.popleft())
        free -= 1
    return taken


def _due_for_a_probe(room: Room) -> List[Entry]:
    """Take out of ``room`` the requests that have waited :data:`PROBE_AFTER` unprobed
    (they are near its head: it is in order of arrival, the probed ones aside)."""
    due = []
    for waiting in room.queue:
        hold = waiting[2]
        if not hold.probed:
            if hold.may_wait_unprobed():
                break
            due.append(waiting)
    for waiting in due:
        room.queue.remove(waiting)
    return due


def head_for_hand_on(consumer: Any, limits: TaskLimits) -> Optional[Entry]:
    """Take the request at the head of ``consumer``'s queue, to hand it a slot of
    ``limits`` that a run ended with (see :mod:`.hand_on`): called in the thread that
    serves the queue, for a newcomer of the same limits, with no start booked or
    promised, that a free pool process (or the look-ahead) can take now; else None."""
    room = getattr(consumer, ROOM_ATTRIBUTE, None) or room_of(consumer)
    if room is None or not room.queue or room.thread != threading.get_ident():
        return None
    with held_lock:
        request, _, hold = room.queue[0]
        if (hold.limits is not limits or hold.booked is not None or hold.promises
                or hold.copy):
            return None
        free, ahead = capacity(consumer)
        if free <= 0 and (free <= -ahead or not spare.get(request.task.name, False)):
            return None  # (not a copy: see may_go_ahead)
        held.pop(request, None)
        room.served = time.monotonic()  # a hand-on serves the queue (see serve_now)
        return room.queue.popleft()


def pool_has_room(consumer: Any) -> bool:
    """Whether a pool process is free to start the request being gated at once: a slot
    taken here is held until a pool process starts the run, so it is taken only then.
    The requests reserved by this worker, the gated one among them, are those in (or on
    their way to) the pool and those held back here. A pool that does not say how many
    processes it has is taken to have room (nothing would tell when it has)."""
    return free_processes_now(consumer) >= 0


def free_processes_now(consumer: Any) -> int:
    """:func:`free_processes`, taking the held requests' lock."""
    with held_lock:
        return capacity(consumer)[0]


def free_processes(consumer: Any) -> int:
    """How many pool processes are free beyond the requests reserved by this worker and
    not held here (the one being gated among them, once taken out of the held ones);
    a large number for a pool that does not say how many processes it has. Called with
    the held requests' lock taken (see :func:`capacity`)."""
    return capacity(consumer)[0]


def capacity(consumer: Any) -> Tuple[int, int]:
    """How many pool processes are free (:func:`free_processes`) and how far the worker
    looks ahead (:func:`lookahead`), from one reading of its pool. Called with the held
    requests' lock taken.

    Every request held here is reserved: Celery reserves a request before its strategy
    hands it on, and only the request's end takes it out, which a held request has not
    reached (one that :func:`gate` ends leaves the held ones first). So the held ones
    are counted, not looked up one by one in the reserved ones (a look-up per held
    request, on every run's end and every tick of the queue's timer, cost the worker's
    main process more than the admission's own Python code); should Celery forget its
    reserved requests (a lost broker connection), no more are counted than it has.
    Both are counted by the size of their weak containers' own dictionaries (their
    ``len`` is Python code, a frame per call, and this runs several times a run; a
    reference whose removal is pending while someone iterates is counted a moment
    longer, as it is in Celery's own state)."""
    pool = consumer.pool
    try:  # (a subscript, not a get call: this runs several times a run)
        prefork = _prefork[type(pool)]
    except KeyError:
        prefork = _looks_ahead(consumer, pool)
    processes = 0
    if prefork:
        # Celery's prefork pool: its process count read as its ``num_processes`` reads
        # it (a property: a frame per call, and this runs several times a run), with
        # attribute reads, not getattr calls.
        try:
            processes = pool._pool._processes
        except AttributeError:
            processes = 0
    if not processes:
        processes = int(getattr(pool, "num_processes", None) or 0)
    if processes <= 0:
        return 1 << 30, 0
    # The reserved requests not held here (never fewer than none), without min().
    busy: int = len(worker_state.reserved_requests.data) - len(held.data)  # type: ignore[attr-defined]
    free = processes - busy if busy > 0 else processes
    return free, (processes if prefork and getattr(consumer, "hub", None) is not None
                  else 0)
