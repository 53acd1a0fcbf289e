"""The leases of runs that ended with no run of their limits waiting in the worker, kept
a moment for the next runs of those limits (see :mod:`.hand_on`).

When a run that may hand its lease on ends and no run of its limits waits here for a
pool process, its lease is kept for at most :data:`SPARE_FOR` (5 ms, as long as its
release would wait for an ask to go with) for the next run of those limits that this
worker gates (:func:`take`), under the hand-on's bounds; then it is given back
(:func:`keep`). Several may be kept at once, as many as the worker has pool processes
(each process's run ends on its own; with one kept at a time, the second of two runs
ending together gave its lease back, and the next run asked the store for it again).

One timer gives the kept leases back (:func:`_unused`): set when a lease is kept and
none is set, it gives back the leases it finds past their time, and comes back for the
next one's; so a worker whose runs come one after another sets a timer every
:data:`SPARE_FOR` or so, not one per run. All of it runs in the thread that serves the
worker's queue (the consumer's).

    >>> Spares().leases
    deque([])
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Deque, Optional, Tuple

from . import hand_on, room

#: How long (s) at most the lease of a run that ended with no run waiting is kept for
#: the next run of its limits (see :func:`keep`): as long as its release waits for an
#: ask to go with (``engine.hub_store.RIDE``). When no run comes, its release then goes
#: as any other, with the next ask or after that wait.
SPARE_FOR = 0.005


class Spares:
    """A worker's kept leases, oldest first, each with until when (monotonic) it is
    kept; how many it keeps at most; and whether the timer that gives them back is
    set."""

    __slots__ = ("leases", "most", "timer_set")

    def __init__(self, most: int = 1) -> None:
        self.leases: Deque[Tuple[hand_on.MainRelease, float]] = deque()
        self.most = most
        self.timer_set = False


def spares_of(consumer: Any) -> Optional[Spares]:
    """``consumer``'s kept leases, if it keeps any (kept on its room), in the thread that
    serves its queue (else None)."""
    here = getattr(consumer, room.ROOM_ATTRIBUTE, None) or room.room_of(consumer)
    if here is None or here.thread != threading.get_ident():
        return None
    return here.spares  # type: ignore[no-any-return]


def keep(consumer: Any, release: Any, now: Optional[float] = None) -> bool:
    """Keep the lease of a run that ended (its ``release``), when no run of its limits
    waits here for a pool process, for the next run of those limits that this worker
    gates within :data:`SPARE_FOR` (see :func:`take`): a lease that may be handed on
    (see :mod:`.hand_on`), in the thread that serves the queue, while fewer than the
    worker's pool processes are kept. True: kept (given back if no run takes it); False:
    the caller gives it back. ``now``: the monotonic clock, when the caller read it."""
    here = room.room_of(consumer)
    if here is None:
        with room.held_lock:
            here = room.room_of(consumer) or room.new_room(consumer)
    if type(release) is not hand_on.MainRelease or here.thread != threading.get_ident():
        return False
    spares = here.spares
    if spares is None:
        spares = here.spares = Spares(max(1, room.lookahead(consumer)))
    if len(spares.leases) >= spares.most:
        return False
    if now is None:
        now = time.monotonic()
    if now >= release.until:  # too old to be handed on (see MainRelease.fresh)
        return False
    spares.leases.append((release, now + SPARE_FOR))
    if not spares.timer_set:
        spares.timer_set = True
        consumer.timer.call_after(SPARE_FOR, _unused, (consumer, spares), priority=6)
    return True


def _unused(consumer: Any, spares: Spares) -> None:
    """Give back the kept leases that no run took in their time (see :func:`keep`), and
    come back when the next one's is up."""
    leases, now = spares.leases, time.monotonic()
    due = []
    while leases and leases[0][1] <= now:
        due.append(leases.popleft()[0])
    if leases:
        consumer.timer.call_after(leases[0][1] - now, _unused, (consumer, spares),
                                  priority=6)
    else:
        spares.timer_set = False
    for release in due:
        release()


def take(consumer: Any, hold: room.Hold) -> Optional[hand_on.MainRelease]:
    """A lease kept for the next run of ``hold.limits`` (see :func:`keep`), the oldest,
    for the run held as ``hold``, which may go to the pool now: None when there is none
    for it (or the run is a copy of a waiting run's message, or holds a promise or a
    booked start), and the run asks."""
    spares = spares_of(consumer)
    if (spares is None or not spares.leases or hold.copy or hold.booked is not None
            or hold.promises):
        return None
    leases, limits = spares.leases, hold.limits
    for entry in leases:
        if entry[0].limits is limits:
            break
    else:
        return None
    leases.remove(entry)
    kept = entry[0]
    if not kept.fresh():
        kept()
        return None
    return kept
