"""How long a task that found no free slot waits before it asks again."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

from ..engine.admission import Busy

#: No countdown is shorter than this (seconds).
MIN_COUNTDOWN = 0.05

#: How long (seconds) a served ticket is remembered beyond the longest countdown a
#: waiting copy can have: room for a worker that is late to run a due message.
SERVED_MEMORY = 600.0


#: How long (seconds) a run that waits in line behind others may go without asking again,
#: beyond ``backoff_max``: its hand-off, not its asking, brings its turn, so a run far
#: back asks about as seldom as its expected wait allows, and a line of thousands does
#: not flood the workers and the broker with asks that would delay every hand-off. Half
#: of :data:`SERVED_MEMORY`, so a served ticket is still remembered for at least five
#: minutes beyond the latest return of its waiting copy.
LINE_COUNTDOWN = SERVED_MEMORY / 2


def keep_ticket_ms(longest_countdown: float) -> int:
    """How long (ms) the line keeps a ticket without news, and remembers it once served.

        >>> keep_ticket_ms(30.0)
        630000
    """
    return round((longest_countdown + SERVED_MEMORY) * 1000)


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

        A run in the semaphore's waiting line is handed a slot when its turn comes (see
        :mod:`celery_redislock.integration.handoff`); its countdown is only the fallback
        for a hand-off
        that went wrong, so it is made long enough not to come back before its turn: at
        least twice the expected wait (its place in the line, over the slots, times the
        average hold time), growing with each attempt, capped by ``backoff_max``, or, for
        a run whose expected wait is longer, by that wait, at most ``backoff_max`` +
        :data:`LINE_COUNTDOWN`.

            >>> policy = RetryPolicy(backoff=1, backoff_max=30, jitter=False)
            >>> far_back = Busy("k", 1, 1, 5.0, 0.02, 0, position=4999)
            >>> policy.countdown(0, far_back)
            200.0
        """
        start, cap, front = self.backoff, self.backoff_max, True
        if busy is not None and busy.average_hold is not None:
            start = min(start, max(busy.average_hold, MIN_COUNTDOWN))
        if busy is not None and busy.position is not None:
            turns = busy.position // max(busy.slots, 1) + 1
            start = max(self.backoff, 2 * turns * (busy.average_hold or self.backoff))
            # Far back in line: ask about as seldom as the expected wait allows; only
            # the runs next in line look out for a crashed holder's lease running out.
            cap = max(cap, min(start, self.backoff_max + LINE_COUNTDOWN))
            front = turns <= 1
        bound = min(cap, start * 2 ** min(attempt, 32))
        if busy is not None and busy.retry_hint > 0 and front:
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

    def keep_ticket_ms(self, ceiling: Optional[float]) -> int:
        """How long a waiting line keeps this task's ticket: beyond its longest countdown."""
        longest = self.backoff_max if ceiling is None else min(self.backoff_max, ceiling)
        return keep_ticket_ms(longest)
