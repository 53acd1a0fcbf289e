"""One round trip that admits a run past every limit on it, or says why not.

A run may be held back by concurrency limits (:class:`SlotLimit`, a leased semaphore)
and rate limits (:class:`RateLimit`, GCRA), over any number of keys. ``admit.lua`` checks
them all and then takes all of them, or none: a run never holds one slot while it waits
for another.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

from .channel import channel_for
from .holder import holder_member
from .keys import rate_key, semaphore_key
from .rate import Rate
from .scripts import ADMIT, REFUND, RELEASE, RENEW, by_hash_slot


@dataclass(frozen=True)
class SlotLimit:
    """At most ``slots`` holders of the semaphore ``name`` at once."""

    name: str
    slots: int
    prefix: str
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", semaphore_key(self.name, self.prefix))
        object.__setattr__(self, "_spec", f"s:{self.slots}")

    def spec(self, promises: Mapping[str, int]) -> str:
        return self._spec


@dataclass(frozen=True)
class RateLimit:
    """Starts of ``name`` spaced to ``rate``, across every process."""

    name: str
    rate: Rate
    prefix: str
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", rate_key(self.name, self.prefix))

    def spec(self, promises: Mapping[str, int]) -> str:
        interval = self.rate.interval * 1_000_000
        tolerance = interval * self.rate.burst
        return f"r:{interval!r}:{tolerance!r}:{int(promises.get(self.key, 0))}"


Limiter = Union[SlotLimit, RateLimit]


@dataclass
class Lease:
    """One holder's slots: what an admission hands out.

    ``fence`` is the fencing number of this acquisition: it is higher than every earlier
    acquisition's of the same semaphores, so a downstream system that remembers the
    highest number it has seen can refuse writes from an older holder whose lease ran out
    while it was paused. ``lost`` turns true when a renewal found that the lease had
    already ended.
    """

    name: str
    fence: int
    lease_seconds: float
    acquired_at_ms: int
    expires_at_ms: int
    lost: bool = False
    _client: Any = field(default=None, repr=False, compare=False)
    _keys: List[str] = field(default_factory=list, repr=False, compare=False)
    _member: str = field(default="", repr=False, compare=False)
    _taken_at: float = field(default_factory=time.monotonic, repr=False, compare=False)
    _contended: bool = field(default=True, repr=False, compare=False)
    #: On Redis Cluster, one lease per hash slot that the run's limits span.
    _parts: List[Lease] = field(default_factory=list, repr=False, compare=False)

    @property
    def token(self) -> str:
        """The holder token: unique to this acquisition."""
        return self._member.split(" ", 1)[0]

    @property
    def holds_slots(self) -> bool:
        """False for a run admitted by rate limits only: nothing to renew or release."""
        return bool(self._keys) or any(part.holds_slots for part in self._parts)

    def renew(self) -> bool:
        """Extend the lease by ``lease_seconds`` from now; False (and ``lost``) if it had ended."""
        if self._parts:
            renewed = [part.renew() for part in self._parts]
            self.lost = self.lost or not all(renewed)
            return all(renewed)
        if not self._keys:
            return True
        lease_end, lost = RENEW.run(
            self._client, self._keys, [self._member, milliseconds(self.lease_seconds)]
        )
        if lost:
            self.lost = True
            return False
        self.expires_at_ms = int(lease_end)
        return True

    def release(self, wait: bool = True) -> bool:
        """Give the slots back; False if they were no longer held (released already, or
        the lease ran out and someone was admitted since). Safe to call twice.

        ``wait=False`` may send the release without waiting for its answer (and then
        returns True): for callers that do not need it.
        """
        if self._parts:
            return all([part.release(wait) for part in self._parts])
        if not self._keys:
            return False
        if len(self._keys) == 1 and not self._contended:
            # Nobody waited when it was taken: no statistics to keep, a plain ZREM will do.
            channel = channel_for(self._client)
            if channel is None:
                return bool(self._client.zrem(self._keys[0], self._member))
            if wait:
                return bool(channel.call("ZREM", self._keys[0], self._member))
            channel.send("ZREM", self._keys[0], self._member)
            return True
        held_ms = round((time.monotonic() - self._taken_at) * 1000)
        return bool(RELEASE.run(self._client, self._keys, [self._member, held_ms]))


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
    run earlier. ``owner`` starts the holder token (see :func:`owner_prefix`). On Redis
    Cluster, limiters in different hash slots are admitted slot by slot, and a refusal
    gives back what the earlier slots took.
    """
    promises = promises or {}
    token = owner + new_token()
    groups = _groups(client, limiters)
    if len(groups) == 1:
        return _admit_group(client, limiters, token, lease, description, promises)
    return _admit_across_slots(client, groups, token, lease, description, promises)


def _groups(client: Any, limiters: Sequence[Limiter]) -> List[List[Limiter]]:
    """The limiters in groups of one Cluster hash slot each (one group elsewhere): those
    without a rate limit first, so that a rate is spent only once the slots are taken."""
    by_key = {limiter.key: limiter for limiter in limiters}
    groups = [[by_key[key] for key in keys]
              for keys in by_hash_slot(client, [limiter.key for limiter in limiters])]
    return sorted(groups, key=lambda group: any(isinstance(x, RateLimit) for x in group))


def _admit_across_slots(client: Any, groups: List[List[Limiter]], token: str, lease: float,
                        description: str, promises: Mapping[str, int]) -> Outcome:
    """Admit group by group; on a refusal, give back what the earlier groups took."""
    taken: List[Tuple[List[Limiter], Lease]] = []
    for group in groups:
        outcome = _admit_group(client, group, token, lease, description, promises)
        if not isinstance(outcome, Lease):
            for earlier_group, earlier in taken:
                earlier.release()
                for limiter in earlier_group:
                    if isinstance(limiter, RateLimit):
                        REFUND.run(client, [limiter.key],
                                   [repr(limiter.rate.interval * 1_000_000)])
            return outcome
        taken.append((group, outcome))
    parts = [part for _, part in taken]
    return Lease(
        name=", ".join(part.name for part in parts if part.name),
        fence=max(part.fence for part in parts),
        lease_seconds=lease,
        acquired_at_ms=min(part.acquired_at_ms for part in parts),
        expires_at_ms=min(part.expires_at_ms for part in parts),
        _client=client,
        _parts=parts,
    )


def _admit_group(client: Any, limiters: Sequence[Limiter], token: str, lease: float,
                 description: str, promises: Mapping[str, int]) -> Outcome:
    """One admit.lua call for limiters that share a Redis node and hash slot."""
    reply = ADMIT.run(
        client,
        [limiter.key for limiter in limiters],
        [token, milliseconds(lease), description,
         *(limiter.spec(promises) for limiter in limiters)],
    )
    if not isinstance(reply, list):  # admitted: "now_ms lease_end_ms fence contended"
        now_ms, lease_end, fence, contended = (int(part) for part in reply.split())
        semaphores = [limiter for limiter in limiters if isinstance(limiter, SlotLimit)]
        return Lease(
            name=", ".join(limiter.name for limiter in semaphores),
            fence=fence,
            lease_seconds=lease,
            acquired_at_ms=now_ms,
            expires_at_ms=lease_end,
            _client=client,
            _keys=[limiter.key for limiter in semaphores],
            _member=holder_member(token, now_ms, fence, description),
            _contended=bool(contended),
        )
    status, now_ms = int(reply[0]), int(reply[1])
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
        key=limiter.key,
        promise=int(reply[3]),
        wait=max(0, int(reply[4])) / 1000.0,
        server_time_ms=now_ms,
    )


def new_token() -> str:
    """A token no other acquisition anywhere has: this process's random id and a counter."""
    return f"{_process_id}{next(_counter):x}"


def _new_process_id() -> None:
    global _process_id, _counter
    _process_id = os.urandom(8).hex() + "."
    _counter = itertools.count()


_process_id, _counter = "", itertools.count()
_new_process_id()
os.register_at_fork(after_in_child=_new_process_id)


def owner_prefix(worker: str, task_id: str = "") -> str:
    """The start of the holder tokens of a worker's runs, or of one task's runs on it.

    Tokens of task runs are ``"<worker node>|<task id>|<random>"``, so the worker's main
    process can free what a pool child that died held, and a restarted worker what its
    previous life held (see :mod:`celery_redislock.recovery`).
    """
    worker = _token_safe(worker)
    return f"{worker}|{_token_safe(task_id)}|" if task_id else f"{worker}|"


def _token_safe(text: str) -> str:
    return text.replace("|", "_").replace(" ", "_")


def milliseconds(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))
