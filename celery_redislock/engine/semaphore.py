"""A counting semaphore in Redis whose every slot is a lease on the server's clock.

One Lua script per operation, so each of acquire, renew and release is one round trip and
atomic. A holder that crashes loses its slot when its lease runs out; a holder that keeps
running renews its lease (see :mod:`celery_redislock.engine.keeper`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator, Optional, Union

from ..errors import LockConfigurationError, LockTimeout
from .admission import Busy, Lease, Paused, SlotLimit, admit
from .bounds import in_range, shown, span
from .keeper import lease_keeper
from .keys import DEFAULT_PREFIX, check_prefix
from .scripts import AVAILABLE, HOLDERS

DEFAULT_LEASE = 30.0


class Semaphore:
    """At most ``slots`` holders of ``name`` at once, across every process using ``client``.

    Example (``redis_url`` is your lock store's URL, e.g. ``"redis://localhost:6379/0"``)::

        >>> import redis
        >>> from celery_redislock import Semaphore
        >>> crawl_slots = Semaphore(redis.Redis.from_url(redis_url), "crawler", slots=2)
        >>> lease = crawl_slots.acquire(blocking=False)  # a Lease, or None if all are taken
        >>> crawl_slots.available()           # slots free now
        1
        >>> crawl_slots.release(lease)        # False when it was no longer held
        True
        >>> lease = crawl_slots.acquire(timeout=0.5)  # waits up to 0.5 s, like threading
        >>> crawl_slots.release(lease)
        True
        >>> with crawl_slots as lease:        # waits for a slot, renews it while inside
        ...     crawl_slots.holders()
        1
        >>> with crawl_slots.hold(timeout=5): # raises LockTimeout after 5 s without a slot
        ...     crawl_slots.available()
        1

    A lease that is not renewed ends ``lease`` seconds after it was taken or last renewed,
    timed by the Redis server's clock, and its slot is free again. Inside ``with`` the
    lease is renewed in the background; after a bare :meth:`acquire` call
    :meth:`Lease.renew` yourself or pass ``keep_alive=True``.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        slots: int = 1,
        lease: float = DEFAULT_LEASE,
        *,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise LockConfigurationError(f"Semaphore name must be a non-empty string, not {name!r}")
        self.client = client
        self.name = name
        self.slots = check_slots(slots, f"Semaphore {name!r}")
        self.lease = check_lease(lease, f"Semaphore {name!r}")
        self.limit = SlotLimit(name, self.slots, check_prefix(prefix))
        self.key = self.limit.key
        self._held_here = threading.local()

    def attempt(self, description: str = "") -> Union[Lease, Busy, Paused]:
        """Try once to take a slot: a :class:`Lease`, or :class:`Busy` (or
        :class:`Paused`, when an operator paused the name) saying why not.

        ``description`` is stored beside the holder for operators (who holds the slot).
        Tasks waiting in the semaphore's line (``LimitedTask``) go first: a free slot is
        not taken while a task that asked earlier waits for it.
        """
        outcome = admit(self.client, [self.limit], lease=self.lease, description=description)
        assert isinstance(outcome, (Lease, Busy, Paused))  # no rate: nothing else
        return outcome

    def acquire(
        self,
        blocking: bool = True,
        timeout: Optional[float] = None,
        *,
        keep_alive: bool = False,
        description: str = "",
    ) -> Optional[Lease]:
        """Take a slot and return its :class:`Lease`, or None if none was free in time.

        The meaning of ``threading.Semaphore.acquire(blocking=True, timeout=None)``: by
        default it waits until a slot is free, for at most ``timeout`` seconds when
        ``timeout`` is given (for ever when it is None), polling no longer apart than the
        earliest current lease has left to run; ``blocking=False`` tries once and never
        waits (with a ``timeout`` too: :class:`ValueError`, as in ``threading``).
        ``keep_alive=True`` renews the lease in a background thread until
        :meth:`release`.

            >>> import redis
            >>> slots = Semaphore(redis.Redis.from_url(redis_url), "export", slots=1)
            >>> held = slots.acquire()                  # free: taken at once
            >>> slots.acquire(blocking=False) is None   # taken: None at once
            True
            >>> slots.acquire(timeout=0.1) is None      # taken: None after 0.1 s
            True
            >>> slots.release(held)
            True
        """
        if not blocking and timeout is not None:
            raise ValueError("can't specify timeout for non-blocking acquire")
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        while True:
            outcome = self.attempt(description)
            if isinstance(outcome, Lease):
                if keep_alive:
                    lease_keeper().keep(outcome)
                return outcome
            if not blocking:
                return None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            hint = outcome.retry_hint if outcome.retry_hint is not None else pause
            sleep = min(pause, max(hint, 0.001))
            if remaining is not None:
                sleep = min(sleep, remaining)
            time.sleep(sleep)
            pause = min(pause * 2, 0.5)

    def release(self, lease: Lease) -> bool:
        """Give back ``lease``'s slot: True if it was held, False if not (already released,
        or its lease ran out and another holder has been admitted since). Never frees
        another holder's slot, and is safe to call twice."""
        lease_keeper().forget(lease)
        return lease.release()

    def renew(self, lease: Lease) -> bool:
        """Extend ``lease`` by the semaphore's lease length; False if it had already ended."""
        return lease.renew()

    def available(self) -> int:
        """How many slots :meth:`acquire` could take now: 0 while the name is paused, else
        the limit (an operator's ``set-slots`` override, else ``slots``) less the live
        leases and reservations, less the tasks waiting in its line without a reservation
        (free slots are theirs first). One read-only script, on the server's clock; the
        answer may be stale by the time you act on it, so use it to look, not to decide.

            >>> import redis
            >>> slots = Semaphore(redis.Redis.from_url(redis_url), "report", slots=3)
            >>> slots.available()
            3
            >>> lease = slots.acquire()
            >>> slots.available()
            2
            >>> slots.release(lease)
            True
        """
        return int(AVAILABLE.run(self.client, [self.key], [self.slots]))

    def holders(self) -> int:
        """How many live leases the semaphore has now (expired ones not counted)."""
        return int(HOLDERS.run(self.client, [self.key], []))

    @contextlib.contextmanager
    def hold(self, timeout: Optional[float] = None, *, description: str = "") -> Iterator[Lease]:
        """Wait for a slot (at most ``timeout`` seconds, else :class:`LockTimeout`), keep
        its lease renewed while the block runs, and release it on the way out."""
        lease = self.acquire(blocking=True, timeout=timeout, keep_alive=True,
                             description=description)
        if lease is None:
            raise LockTimeout(f"no free slot of {self.name!r} within {timeout} s")
        try:
            yield lease
        finally:
            self.release(lease)

    def __enter__(self) -> Lease:
        stack = self._held_here.__dict__.setdefault("stack", [])
        context = self.hold()
        lease = context.__enter__()
        stack.append(context)
        return lease

    def __exit__(self, *exc_info: Any) -> None:
        self._held_here.stack.pop().__exit__(*exc_info)

    def __repr__(self) -> str:
        return f"Semaphore({self.name!r}, slots={self.slots}, lease={self.lease})"


#: The range of a semaphore's slot count.
MIN_SLOTS, MAX_SLOTS = 1, 1_000_000

#: The range of a lease, in seconds: a tenth of a second to a day.
MIN_LEASE, MAX_LEASE = 0.1, 86400.0


def check_slots(slots: Any, owner: str, option: str = "slots") -> int:
    """Return ``slots`` if it is an integer from :data:`MIN_SLOTS` to :data:`MAX_SLOTS`,
    else raise :class:`LockConfigurationError`.

        >>> check_slots(3, "Semaphore 'crawl'")
        3
    """
    if not isinstance(slots, int) or not in_range(slots, MIN_SLOTS, MAX_SLOTS):
        raise LockConfigurationError(
            f"{owner}: {option} must be a positive integer, {span(MIN_SLOTS, MAX_SLOTS)}, "
            f"not {shown(slots)}"
        )
    return slots


def check_lease(lease: Any, owner: str, option: str = "lease") -> float:
    """Return ``lease`` as seconds if it is a number from :data:`MIN_LEASE` to
    :data:`MAX_LEASE`, else raise :class:`LockConfigurationError`.

        >>> check_lease(20, "Semaphore 'crawl'")
        20.0
    """
    if not in_range(lease, MIN_LEASE, MAX_LEASE):
        raise LockConfigurationError(
            f"{owner}: {option} must be a positive number of seconds, "
            f"{span(MIN_LEASE, MAX_LEASE)}, not {shown(lease)}"
        )
    return float(lease)
