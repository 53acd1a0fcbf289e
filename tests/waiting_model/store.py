"""The lock store: each function is one script, atomic on the store's clock ``now`` (s).

A key has ``slots``; its holders are scored by the end of their leases; its line is the
waiters' references (``(task id, attempt)`` -> since, park id) plus *anonymous* entries
(parked messages counted from the broker after the store lost its data); a release
*reserves* a slot for the line and asks its caller to move one message out of parking.
A restart without data starts a new incarnation and, for the longest lease, a grace in
which nothing is granted (bodies admitted before may still run) and live leases are
written back when renewed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from celery_redislock.engine.admission import Busy, Lease, Served

LEASE = 30          # every run's lease (s); a live body renews it at every tick
GRACE = LEASE       # the grace after a loss: the longest lease
RESERVE = 10        # a reservation not claimed in this time returns to the line

Run = Tuple[str, int]


@dataclass
class Ref:
    """A waiter's reference: ``waiting`` (its copy parked as ``park_id``), ``claimed`` by
    ``holder`` (a copy took a slot; its body has not started, or acks late and has not
    ended), or ``served`` (kept as long as the broker may give back a copy of it).
    ``copy``: the id of the moved copy that claimed it, acking late ("" otherwise)."""

    since: int
    park_id: str
    state: str = "waiting"
    holder: str = ""
    copy: str = ""


@dataclass
class Store:
    slots: Dict[str, int]
    keep_claims: bool = True          # as first written: a claim removes the reference
    incarnation: int = 1
    counted: int = 1                  # the incarnation whose lines were counted
    grace_until: int = 0
    up: bool = True
    holders: Dict[str, Dict[str, int]] = field(default_factory=dict)
    refs: Dict[str, Dict[Run, Ref]] = field(default_factory=dict)
    anonymous: Dict[str, int] = field(default_factory=dict)
    reservations: Dict[str, List[int]] = field(default_factory=dict)
    parks: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def live_holders(self, key: str, now: int) -> Dict[str, int]:
        return {h: end for h, end in self.holders.get(key, {}).items() if end > now}

    def live_reservations(self, key: str, now: int) -> List[int]:
        return [end for end in self.reservations.get(key, []) if end > now]

    def free(self, key: str, now: int) -> int:
        taken = len(self.live_holders(key, now)) + len(self.live_reservations(key, now))
        return self.slots[key] - taken

    def waits(self, key: str, ref: Ref, now: int) -> bool:
        """In line: parked, or claimed by a holder whose lease ran out (it died before
        its body started, or killed in it and acking late: Celery runs it again)."""
        claimed_dead = ref.state == "claimed" and ref.holder not in self.live_holders(key, now)
        return ref.state == "waiting" or claimed_dead

    def waiting(self, key: str, now: int, but: Optional[Run] = None) -> int:
        refs = self.refs.get(key, {})
        known = sum(self.waits(key, ref, now) for run, ref in refs.items() if run != but)
        return known + self.anonymous.get(key, 0)

    def lines(self) -> Dict[str, Dict[Run, Ref]]:
        """The references not yet served, by key."""
        return {key: {run: ref for run, ref in refs.items() if ref.state != "served"}
                for key, refs in self.refs.items()}

    def in_grace(self, now: int) -> bool:
        return now < self.grace_until


def _lease(key: str, now: int) -> Lease:
    return Lease(name=key, fence=0, lease_seconds=LEASE, acquired_at_ms=now * 1000,
                 expires_at_ms=(now + LEASE) * 1000)


def _busy(store: Store, key: str, now: int) -> Busy:
    return Busy(name=key, holders=len(store.live_holders(key, now)), slots=store.slots[key],
                retry_hint=1.0, average_hold=None, server_time_ms=now * 1000, key=key)


def _take(store: Store, key: str, run: Run, holder: str, now: int, copy: str = "") -> Lease:
    """The run holds a slot; a reference it has is claimed by this holder (and copy)."""
    store.holders.setdefault(key, {})[holder] = now + LEASE
    ref = store.refs.get(key, {}).get(run)
    if ref is not None and not store.keep_claims:
        del store.refs[key][run]
    elif ref is not None:
        ref.state, ref.holder, ref.copy = "claimed", holder, copy
    return _lease(key, now)


def _claimed_live(store: Store, key: str, ref: Optional[Ref], now: int) -> bool:
    return ref is not None and ref.state == "claimed" and not store.waits(key, ref, now)


def park(store: Store, key: str, run: Run, now: int) -> str:
    """``park.lua``: add or replace the run's reference (keeping its place); its new park
    id. A reference claimed by a live holder is kept as it is (its park id returned): the
    copy asking is a duplicate or its claimer's redelivery, told apart when it comes back."""
    refs = store.refs.setdefault(key, {})
    if _claimed_live(store, key, refs.get(run), now):
        return refs[run].park_id
    park_id = f"{store.incarnation}:{next(store.parks)}"
    since = refs[run].since if run in refs else now
    refs[run] = Ref(since, park_id)
    return park_id


def admit(store: Store, key: str, run: Run, holder: str, now: int,
          ref_on_refusal: bool, copy: str = "") -> Tuple[object, str]:
    """``admit.lua`` for a copy never parked (or parked in a lost incarnation): a lease if
    a slot is free and nobody else waits, else Busy; with ``ref_on_refusal`` the refusal
    writes the reference in the same step (its park id returned)."""
    ref = store.refs.get(key, {}).get(run)
    if ref is not None and ref.state == "served":
        return Served(name=key, server_time_ms=now * 1000), ""
    if ref is not None and _claimed_live(store, key, ref, now):
        return _busy(store, key, now), ref.park_id if ref_on_refusal else ""
    if (not store.in_grace(now) and store.free(key, now) > 0
            and not store.waiting(key, now, but=run)):
        return _take(store, key, run, holder, now, copy), ""
    park_id = park(store, key, run, now) if ref_on_refusal else ""
    return _busy(store, key, now), park_id


def claim(store: Store, key: str, run: Run, park_id: str, holder: str, now: int,
          ref_on_refusal: bool, copy: str = "") -> Tuple[object, str]:
    """``admit_parked.lua`` for a moved copy (its id ``copy`` when it acks late): it
    takes a reservation if its reference names its park id; a copy the reference does
    not name is stale (``Served``). A reference served to this very copy (its worker
    died after the release, before the acknowledgement) reads as claimed by a dead
    holder: the copy runs again, as Celery runs it (``rerun_ref``)."""
    if park_id.split(":")[0] != str(store.incarnation):
        return _claim_lost(store, key, run, holder, now, ref_on_refusal)
    ref = store.refs.get(key, {}).get(run)
    if ref is not None and ref.state == "served" and copy and ref.copy == copy:
        ref.state, ref.holder, ref.park_id = "claimed", "", park_id
    if ref is None or ref.park_id != park_id or ref.state == "served":
        if store.anonymous.get(key, 0) > 0:
            store.anonymous[key] -= 1
        return Served(name=key, server_time_ms=now * 1000), ""
    if _claimed_live(store, key, ref, now):
        return _busy(store, key, now), ref.park_id if ref_on_refusal else ""
    if not store.in_grace(now) and _reserved(store, key, now):
        return _take(store, key, run, holder, now, copy), ""
    return admit(store, key, run, holder, now, ref_on_refusal, copy)


def _claim_lost(store: Store, key: str, run: Run, holder: str, now: int,
                ref_on_refusal: bool) -> Tuple[object, str]:
    """A copy parked before the store lost its data: counted as anonymous, it takes a
    reservation like any; else it asks as a newcomer."""
    if store.anonymous.get(key, 0) > 0:
        store.anonymous[key] -= 1
    if not store.in_grace(now) and _reserved(store, key, now):
        return _take(store, key, run, holder, now), ""
    return admit(store, key, run, holder, now, ref_on_refusal)


def _reserved(store: Store, key: str, now: int) -> bool:
    """Take one live reservation of ``key`` (it becomes the claimer's slot)."""
    live = store.live_reservations(key, now)
    if not live:
        return False
    live.sort()
    live.pop(0)
    store.reservations[key] = live
    return True


def hand_over(store: Store, key: str, now: int) -> int:
    """Reserve every free slot the line can use; how many moves out of parking are owed."""
    if store.in_grace(now):
        return 0
    reserved = store.live_reservations(key, now)
    moves = max(0, min(store.free(key, now), store.waiting(key, now) - len(reserved)))
    store.reservations[key] = reserved + [now + RESERVE] * moves
    return moves


def release(store: Store, key: str, holder: str, now: int) -> int:
    """``release.lua``: remove the holder (if it is one), its reference served, hand
    over; moves owed."""
    store.holders.get(key, {}).pop(holder, None)
    started(store, key, holder)
    return hand_over(store, key, now)


def started(store: Store, key: str, holder: str) -> None:
    """The body of ``holder`` started and its message is acknowledged (default acks; the
    pool's adoption of the lease) or it ended: its reference is served."""
    for ref in store.refs.get(key, {}).values():
        if ref.state == "claimed" and ref.holder == holder:
            ref.state = "served"


def renew(store: Store, key: str, holder: str, now: int) -> bool:
    """``renew.lua``: extend a live lease; write back one the store lost, in the grace.
    Whether the lease was extended."""
    holders = store.holders.setdefault(key, {})
    if holders.get(holder, 0) > now or (holder not in holders and store.in_grace(now)):
        holders[holder] = now + LEASE
        return True
    return False


def recount(store: Store, parked: Mapping[str, int]) -> None:
    """A new incarnation seen: the parking queues' lengths become anonymous entries."""
    for key, length in parked.items():
        store.anonymous[key] = max(0, length - len(store.refs.get(key, {})))
    store.counted = store.incarnation


def moved_nothing(store: Store, key: str, now: int) -> None:
    """A move found the parking queue empty: the anonymous entries were counted too many
    (copies claimed since), and the reservation it was for is given back."""
    store.anonymous[key] = 0
    _reserved(store, key, now)


def due(store: Store, parked: Mapping[str, int], now: int) -> Dict[str, int]:
    """``due.lua``, the fixed protocol's poll: a line with nobody known in it but messages
    in its parking queue counts them as anonymous entries; every key hands its free
    slots over (freed by leases that ran out, reservations that lapsed, the grace's end).
    The moves owed, by key."""
    for key, length in parked.items():
        empty = not store.waiting(key, now) and not store.live_reservations(key, now)
        if empty and length:
            store.anonymous[key] = length
    return {key: hand_over(store, key, now) for key in store.slots}


def restart(store: Store, keep_data: bool, now: int) -> None:
    """The store restarts; without its data, a new incarnation and its grace."""
    if keep_data:
        return
    store.incarnation += 1
    store.grace_until = now + GRACE
    store.holders.clear()
    store.refs.clear()
    store.anonymous.clear()
    store.reservations.clear()
