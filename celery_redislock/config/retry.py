"""How long a task that found no free slot waits before it asks again."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from ..engine.admission import Busy

#: No countdown is shorter than this (seconds).
MIN_COUNTDOWN = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, capped, and informed by the semaphore.

    The n-th wait (n from 0) is at most ``min(backoff_max, start * 2**n)``, where ``start``
    is ``backoff``, or the semaphore's recent average hold time when that is shorter (no
    use sleeping for a second when slots turn over every 200 ms). It is never longer than
    the earliest current lease has left to run (a crashed holder's slot is free then),
    nor than ``ceiling``. With ``jitter`` the wait is drawn between half that bound and
    the bound, so waiters spread out instead of knocking together.

        >>> RetryPolicy(backoff=1, backoff_max=30, jitter=False).countdown(3)
        8.0
    """

    backoff: float = 1.0
    backoff_max: float = 30.0
    jitter: bool = True
    max_wait: Optional[float] = None
    #: The run's priority in a parked line (``lock_priority``: higher first; None: the
    #: message's ``priority`` property if any, else none), and how many seconds of
    #: waiting are worth one step of priority (``lock_priority_aging``).
    priority: Optional[int] = None
    priority_aging: float = 10.0

    def countdown(
        self, attempt: int, busy: Optional[Busy] = None, ceiling: Optional[float] = None
    ) -> float:
        """The countdown of the ``attempt``-th wait (from 0) after refusal ``busy``.

            >>> policy = RetryPolicy(backoff=1, backoff_max=30, jitter=False)
            >>> policy.countdown(0, Busy("k", 1, 1, 5.0, 0.02, 0))
            0.05
        """
        start = self.backoff
        if busy is not None and busy.average_hold is not None:
            start = min(start, max(busy.average_hold, MIN_COUNTDOWN))
        bound = min(self.backoff_max, start * 2 ** min(attempt, 32))
        if busy is not None and busy.retry_hint > 0:
            bound = min(bound, busy.retry_hint)
        if ceiling is not None:
            bound = min(bound, ceiling)
        bound = max(bound, MIN_COUNTDOWN)
        if self.jitter:
            return random.uniform(bound / 2, bound)
        return float(bound)

    def paused_countdown(self, pause_left: Optional[float], ceiling: Optional[float]) -> float:
        """The countdown of a run that found its limit paused: until the pause ends
        (spread over up to a tenth more, so that waiters do not all return at once), at
        most ``backoff_max`` (a pause can be lifted early) and ``ceiling``.

            >>> RetryPolicy(backoff_max=30, jitter=False).paused_countdown(5, None)
            5.0
        """
        bound = self.backoff_max if pause_left is None else min(pause_left, self.backoff_max)
        if ceiling is not None:
            bound = min(bound, ceiling)
        bound = max(bound, MIN_COUNTDOWN)
        if self.jitter:
            return bound + random.uniform(0, min(1.0, bound / 10))
        return float(bound)
