"""A rate limit shared by every process: GCRA on the Redis server's clock."""

from __future__ import annotations

import time
from typing import Any, Optional, Union

from .admission import Busy, Paused, RateLimit, RateLimited, admit
from .keys import DEFAULT_PREFIX, check_prefix
from .rate import Rate

#: How often (seconds, at most) a waiting ``acquire`` asks again while the name is paused.
PAUSED_POLL = 1.0

class RateLimiter:
    """At most ``rate`` starts of ``name``, across every process using ``client``.

    Example::

        import redis
        from celery_redislock import RateLimiter

        partner_api = RateLimiter(redis.Redis(), "partner-api", rate="10/s")

        if partner_api.try_acquire():          # one round trip, never waits
            call_partner()

        if partner_api.acquire(timeout=5):     # waits for its turn, at most 5 s
            call_partner()

    A refused caller is promised a start time, and callers that wait are served in the
    order they were promised; newcomers do not overtake them. A caller that gives up
    leaves its promised turn unused (the rate dips by one start).
    """

    def __init__(
        self, client: Any, name: str, rate: Any, *, burst: int = 1,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.client = client
        self.name = name
        self.rate = Rate.parse(rate, burst, owner=f"RateLimiter {name!r}")
        self.limit = RateLimit(name, self.rate, check_prefix(prefix))

    def attempt(self, promise: Optional[int] = None, *,
                will_wait: bool = True) -> Optional[Union[RateLimited, Paused]]:
        """Try once: None when admitted, else :class:`RateLimited` with the promised start
        (or :class:`Paused` when an operator paused the name).

        Pass back the ``promise`` of an earlier refusal to keep its place in the line.
        ``will_wait=False`` asks to be promised nothing: a caller that will not come back
        must not hold up the line.
        """
        if not will_wait:
            promise = -1
        promises = {self.limit.key: promise} if promise else None
        outcome = admit(self.client, [self.limit], lease=1, promises=promises)
        assert not isinstance(outcome, Busy)
        return outcome if isinstance(outcome, (RateLimited, Paused)) else None

    def try_acquire(self) -> bool:
        """True if a start is allowed now (and counted), else False; never waits."""
        return self.attempt(will_wait=False) is None

    def acquire(self, timeout: Optional[float] = None) -> bool:
        """Wait for this caller's turn: True once admitted, False after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        promise: Optional[int] = None
        while True:
            refused = self.attempt(promise)
            if refused is None:
                return True
            if isinstance(refused, Paused):
                wait = PAUSED_POLL if refused.retry_hint is None \
                    else min(PAUSED_POLL, max(refused.retry_hint, 0.001))
            else:
                promise = refused.promise
                wait = max(refused.wait, 0.001)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining < wait:
                    return False
            time.sleep(wait)

    def __repr__(self) -> str:
        return f"RateLimiter({self.name!r}, rate={self.rate})"
