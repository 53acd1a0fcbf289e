"""Background renewal of held leases, one thread per process, safe across ``fork``.

Celery's prefork pool forks its children after the worker has started, and threads do
not survive a fork: so the keeper is made lazily, in the process that first needs it, and
forgotten in a forked child (``os.register_at_fork``), which then makes its own. The same
code serves the prefork, threads and solo pools and plain Python programs.

A lease is renewed every third of its length. When Redis cannot be reached the keeper
retries sooner; once a lease's time is certainly up without a successful renewal, or
a renewal finds the lease gone, the lease is marked ``lost``, an error is logged, and
the ``on_lost`` callbacks run. An unexpected error in the thread is logged and the
thread goes on after :data:`PAUSE_AFTER_FAILURE` seconds: renewals never stop silently.

The same thread finishes the releases of runs
(:meth:`~celery_redislock.engine.admission.Lease.release_soon`) that their own thread has left
for :data:`SETTLE_AFTER` seconds: a release waits to be written with its thread's next
request to the lock store, or is written but its answer is unread. A busy process does
it itself long before (its next run's admission carries the release); a process that
got no next run may not, and the release frees a slot, which the answer may hand to a
parked line. So the keeper, which looks at least every :data:`IDLE_WAKE` seconds, looks
:data:`SETTLE_AFTER` seconds after the oldest such request, and while its process sent
some within the last :data:`IDLE_WAKE` seconds it looks at least that often; it is woken
only when a process starts sending them after a quiet spell.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol

from .channel import oldest_unsettled, settle_all, unsettled, when_unsettled
from .refusal import describe_error

logger = logging.getLogger(__name__)

class Renewable(Protocol):
    """What the keeper needs of a lease: a :class:`Lease`, or any lease of the same shape
    (the unique-send lease of :mod:`celery_redislock.engine.owned`, a worker's
    registration of :mod:`celery_redislock.engine.workers`)."""

    name: str
    lease_seconds: float
    lost: bool
    fence: int

    @property
    def token(self) -> str: ...

    def renew(self) -> bool: ...


LostCallback = Callable[[Any], None]

#: Seconds between two looks of an idle keeper.
IDLE_WAKE = 1.0

#: Releases left by their own thread for this long (seconds) are finished by the keeper:
#: the longest a slot stays taken, and a parked line unserved, after its run ended.
SETTLE_AFTER = 0.01

#: Seconds the thread waits after an unexpected error before it looks again.
PAUSE_AFTER_FAILURE = 1.0


@dataclass
class _Kept:
    lease: Renewable
    due: float
    last_renewed: float
    on_lost: List[LostCallback] = field(default_factory=list)


class LeaseKeeper:
    """Keeps leases alive until they are forgotten.

    Example::

        keeper = lease_keeper()
        keeper.keep(lease, on_lost=lambda lease: log.error("lost %s", lease.name))
        try:
            work()
        finally:
            keeper.forget(lease)
            lease.release()
    """

    def __init__(self) -> None:
        self._kept: Dict[str, _Kept] = {}
        #: Guards the leases kept and the thread's next look; taken directly on the
        #: task path (a C call), and through the condition by the thread.
        self._lock = threading.Lock()  # never taken twice
        self._wakeup = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
        self._next_due = 0.0

    def keep(self, lease: Renewable, on_lost: Optional[LostCallback] = None) -> None:
        """Renew ``lease`` in the background from now on."""
        now = time.monotonic()
        due = now + lease.lease_seconds / 3
        entry = _Kept(lease, due, now, [on_lost] if on_lost else [])
        with self._lock:
            self._kept[lease.token] = entry
            # Wake the thread only if it sleeps past this lease's first renewal.
            if self._thread is None or due < self._next_due:
                self._ensure_thread()
                self._next_due = due
                self._wakeup.notify()

    def look_soon(self) -> None:
        """Look at releases left unfinished within :data:`SETTLE_AFTER` seconds (a
        wake-up only if the thread sleeps longer than that)."""
        soon = time.monotonic() + SETTLE_AFTER
        if self._thread is None or self._next_due <= soon:
            return  # no thread yet (nothing to settle for it), or it looks soon anyway
        with self._wakeup:
            if self._next_due > soon:
                self._next_due = soon
                self._wakeup.notify()

    def report_lost(self, lease: Renewable, why: str) -> None:
        """``lease`` was found gone (not by a renewal of this keeper): stop renewing it,
        log it and run its ``on_lost`` callbacks, as for a failed renewal."""
        with self._lock:
            entry = self._kept.get(lease.token)
        if entry is not None and entry.lease is lease:
            self._report_lost(entry, why)

    def forget(self, lease: Renewable) -> None:
        """Stop renewing ``lease`` (it is about to be released, or was lost)."""
        with self._lock:
            self._kept.pop(lease.token, None)

    def kept(self) -> List[Renewable]:
        """The leases being renewed now."""
        with self._wakeup:
            return [entry.lease for entry in self._kept.values()]

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name="celery-redislock-keeper", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._look()
            except Exception:  # never let renewals stop: log, pause, go on
                logger.exception("celery-redislock: the lease keeper failed; retrying")
                time.sleep(PAUSE_AFTER_FAILURE)

    def _look(self) -> None:
        """Wait until something is due, then renew what is due and settle releases."""
        with self._wakeup:
            due = self._due_now()
            if not due:
                self._wakeup.wait(timeout=self._seconds_to_next())
        # Requests left unwritten go first: a renewal must find the adoption done.
        settle_all(older_than=SETTLE_AFTER)
        for entry in due:
            self._renew(entry)

    def _due_now(self) -> List[_Kept]:
        now = time.monotonic()
        return [entry for entry in self._kept.values() if entry.due <= now]

    def _seconds_to_next(self) -> float:
        # It looks up at least every second, so that keeping a new lease (first due a
        # third of a lease from now) seldom needs to wake it: a wake-up costs a context
        # switch on every task. While releases flow, by the oldest one left unfinished.
        now = time.monotonic()
        look = now + IDLE_WAKE
        oldest = oldest_unsettled()
        if oldest is not None:
            look = min(look, oldest + SETTLE_AFTER)
        elif unsettled(within=IDLE_WAKE):
            look = min(look, now + SETTLE_AFTER)
        self._next_due = min([entry.due for entry in self._kept.values()] + [look])
        return max(0.0, self._next_due - now)

    def _renew(self, entry: _Kept) -> None:
        lease = entry.lease
        started = time.monotonic()
        try:
            renewed = lease.renew()
        except Exception as exc:  # Redis down or slow: the lease may still be alive
            if started - entry.last_renewed >= lease.lease_seconds:
                lease.lost = True
                self._report_lost(entry, f"Redis unreachable for a whole lease: {exc!r}")
                return
            retry_in = min(1.0, lease.lease_seconds / 10)
            logger.warning(
                "celery-redislock: could not renew the lease on %r of holder %s (%s); "
                "retrying in %.1f s", lease.name, lease.token, describe_error(exc), retry_in,
            )
            self._reschedule(entry, started + retry_in)
            return
        if not renewed:
            self._report_lost(entry, "the lease had already ended when renewed")
            return
        entry.last_renewed = started
        self._reschedule(entry, started + lease.lease_seconds / 3)

    def _reschedule(self, entry: _Kept, due: float) -> None:
        with self._wakeup:
            if entry.lease.token in self._kept:
                entry.due = due

    def _report_lost(self, entry: _Kept, why: str) -> None:
        with self._wakeup:
            still_kept = self._kept.pop(entry.lease.token, None) is not None
        if not still_kept:
            return  # released meanwhile: nothing was lost
        logger.error(
            "celery-redislock: LEASE LOST on %r by holder %s (fence %s): %s; the slot may "
            "now be held by another holder while this one still runs",
            entry.lease.name, entry.lease.token, entry.lease.fence, why,
        )
        for callback in entry.on_lost:
            try:
                callback(entry.lease)
            except Exception:
                logger.exception("celery-redislock: a lease-lost callback failed")


_keeper: Optional[LeaseKeeper] = None
_keeper_guard = threading.Lock()


def lease_keeper() -> LeaseKeeper:
    """This process's :class:`LeaseKeeper`, made on first use."""
    global _keeper
    if _keeper is None:
        with _keeper_guard:
            if _keeper is None:
                _keeper = LeaseKeeper()
    return _keeper


def _forget_parent_keeper() -> None:
    global _keeper, _keeper_guard
    _keeper = None
    _keeper_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_keeper)


def _look_soon() -> None:
    if _keeper is not None:
        _keeper.look_soon()


when_unsettled(_look_soon)
