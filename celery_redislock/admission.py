"""One round trip that admits a run past every limit on it, or says why not.

A run may be held back by concurrency limits (:class:`SlotLimit`, a leased semaphore)
and rate limits (:class:`RateLimit`, GCRA), over any number of keys. ``admit.lua`` checks
them all and then takes all of them, or none: a run never holds one slot while it waits
for another.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .keys import rate_key, redis_keys
from .rate import Rate
from .scripts import ADMIT, RELEASE, RENEW


@dataclass(frozen=True)
class SlotLimit:
    """At most ``slots`` holders of the semaphore ``name`` at once."""

    name: str
    slots: int
    prefix: str
    keys: List[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", list(redis_keys(self.name, self.prefix)))


@dataclass(frozen=True)
class RateLimit:
    """Starts of ``name`` spaced to ``rate``, across every process."""

    name: str
    rate: Rate
    prefix: str
    keys: List[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", [rate_key(self.name, self.prefix)])


Limiter = Union[SlotLimit, RateLimit]


@dataclass
class Lease:
    """One holder's slots: what an admission hands out.

    ``fence`` is the fencing number of this acquisition: it increases with every
    acquisition of the same semaphore, so a downstream system that remembers the highest
    number it has seen can refuse writes from an older holder whose lease ran out while it
    was paused (for several semaphores, ``fences`` has one per semaphore name). ``lost``
    turns true when a renewal found that the lease had already ended.
    """

    name: str
    token: str
    fence: int
    lease_seconds: float
    acquired_at_ms: int
    expires_at_ms: int
    lost: bool = False
    fences: Dict[str, int] = field(default_factory=dict)
    _client: Any = field(default=None, repr=False, compare=False)
    _keys: List[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def holds_slots(self) -> bool:
        """False for a run admitted by rate limits only: nothing to renew or release."""
        return bool(self._keys)

    def renew(self) -> bool:
        """Extend the lease by ``lease_seconds`` from now; False (and ``lost``) if it had ended."""
        if not self._keys:
            return True
        lease_end, lost = RENEW.run(
            self._client, self._keys, [self.token, milliseconds(self.lease_seconds)]
        )
        if lost:
            self.lost = True
            return False
        self.expires_at_ms = int(lease_end)
        return True

    def release(self) -> bool:
        """Give the slots back; False if they were no longer held. Safe to call twice."""
        if not self._keys:
            return False
        return bool(RELEASE.run(self._client, self._keys, [self.token]))


@dataclass(frozen=True)
class Busy:
    """Refused by a concurrency limit: every slot of ``name`` was taken.

    ``retry_hint`` is the time (seconds) until the earliest current lease ends, which is
    when a crashed holder's slot would come back; ``average_hold`` is the recent average
    time holders kept a slot, or None before anyone released one.
    """

    name: str
    holders: int
    slots: int
    retry_hint: float
    average_hold: Optional[float]
    server_time_ms: int


@dataclass(frozen=True)
class RateLimited:
    """Refused by a rate limit: the run is promised a start ``wait`` seconds from now.

    Coming back with ``promise`` (pass it in ``promises``) keeps its place in the line.
    """

    name: str
    key: str
    promise: int
    wait: float
    server_time_ms: int


Outcome = Union[Lease, Busy, RateLimited]


def admit(
    client: Any,
    limiters: Sequence[Limiter],
    *,
    lease: float,
    description: str = "",
    promises: Optional[Mapping[str, int]] = None,
    owner: str = "",
) -> Outcome:
    """Try once to pass every limiter: a :class:`Lease`, :class:`Busy` or :class:`RateLimited`.

    ``promises`` maps a rate limiter's Redis key to the start time (µs) it promised this
    run earlier. ``owner`` starts the holder token (see :func:`holder_token`). All limiters
    must live on one Redis server (or one Cluster hash slot).
    """
    promises = promises or {}
    token = owner + uuid.uuid4().hex
    keys: List[str] = []
    args: List[Any] = [token, milliseconds(lease), description, len(limiters)]
    for limiter in limiters:
        limiter_keys = limiter.keys
        keys.extend(limiter_keys)
        if isinstance(limiter, SlotLimit):
            args.extend(("s", limiter.slots, 0, 0))
        else:
            interval = limiter.rate.interval * 1_000_000
            args.extend((
                "r", repr(interval), repr(interval * (limiter.rate.burst - 1)),
                int(promises.get(limiter_keys[0], 0)),
            ))
    reply = ADMIT.run(client, keys, args)
    status, now_ms = int(reply[0]), int(reply[1])
    if status == 1:
        lease_end = int(reply[2])
        slot_limits = [
            (limiter, int(fence)) for limiter, fence in zip(limiters, reply[3:])
            if isinstance(limiter, SlotLimit)
        ]
        fences = {limiter.name: fence for limiter, fence in slot_limits}
        return Lease(
            name=", ".join(limiter.name for limiter, _ in slot_limits),
            token=token,
            fence=slot_limits[0][1] if slot_limits else 0,
            lease_seconds=lease,
            acquired_at_ms=now_ms,
            expires_at_ms=lease_end,
            fences=fences,
            _client=client,
            _keys=[key for limiter, _ in slot_limits for key in limiter.keys],
        )
    limiter = limiters[int(reply[2]) - 1]
    if status == 0:
        assert isinstance(limiter, SlotLimit)
        _, _, _, holders, until_first_end, average_hold = reply
        return Busy(
            name=limiter.name,
            holders=int(holders),
            slots=limiter.slots,
            retry_hint=max(0, int(until_first_end)) / 1000.0,
            average_hold=None if int(average_hold) < 0 else int(average_hold) / 1000.0,
            server_time_ms=now_ms,
        )
    return RateLimited(
        name=limiter.name,
        key=limiter.keys[0],
        promise=int(reply[3]),
        wait=max(0, int(reply[4])) / 1000.0,
        server_time_ms=now_ms,
    )


def owner_prefix(worker: str, task_id: str = "") -> str:
    """The start of the holder tokens of a worker's runs, or of one task's runs on it.

    Tokens of task runs are ``"<worker node>|<task id>|<random>"``, so the worker's main
    process can free what a pool child that died held, and a restarted worker what its
    previous life held (see :mod:`celery_redislock.recovery`).
    """
    worker = worker.replace("|", "_")
    return f"{worker}|{task_id}|" if task_id else f"{worker}|"


def milliseconds(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))
