"""A parked run's claim when its holder never releases (its release failed: the lock
store did not answer it, or its worker died), on a real redis-server: found by the
history check on the broker line, where such claims were left once everything had
settled. A claim lapses with its holder's lease (``lua/parking.lua``'s
``lapse_claims``): the claim is dropped, its reference stays claimed by the dead holder
for as long as the broker may give a copy back, then is forgotten."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from celery_redislock.engine.admission import Busy, Lease, ParkedMove, Served, SlotLimit
from celery_redislock.engine.parked_view import read_parked_lines
from celery_redislock.engine.parking import due, park_admit, run_id

PREFIX = "redislock:"


def companion(key: str, mark: str) -> str:
    return key.replace("}:s:", f"}}:{mark}:", 1)


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def claimed(client: Any, key: str) -> int:
    line = read_parked_lines(client, [key], server_ms(client)).get(key)
    return 0 if line is None else line.claimed


def poll_until(check: Callable[[], bool], client: Any, key: str, seconds: float = 10) -> None:
    """Poll the line (as every worker does) until ``check`` holds."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        due(client, {key: 0}, prefix=PREFIX)
        time.sleep(0.05)


def moved_claim(client: Any, name: str, lease: float, keep_ms: int = 3600 * 1000,
                copy: str = "") -> Any:
    """A run ``first`` holds the one slot, ``moved`` parks behind it; ``first`` releases,
    the move owed is made and the moved copy (its id ``copy``: acks late) claims its
    reservation with ``lease``. ``(key, parked Busy, moved Lease)``."""
    limit = [SlotLimit(name, 1, PREFIX)]
    key = limit[0].key
    first = park_admit(client, limit, lease=30, run=run_id("first", 0))
    assert isinstance(first, Lease)
    parked = park_admit(client, limit, lease=30, run=run_id("moved", 0),
                        keep_served_ms=keep_ms)
    assert isinstance(parked, Busy) and parked.park is not None
    assert first.release()
    assert [h for h in first.handoffs if isinstance(h, ParkedMove)] == [ParkedMove(key)]
    moved = park_admit(client, limit, lease=lease, run=run_id("moved", 0),
                       parked=parked.park, keep_served_ms=keep_ms, copy=copy)
    assert isinstance(moved, Lease)
    assert claimed(client, key) == 1
    return key, parked, moved


def test_a_claim_whose_lease_ran_out_unreleased_is_dropped(redis_client):
    key, parked, _ = moved_claim(redis_client, "claims", lease=0.3)
    # Its release fails (the store unreachable): its lease runs out; the poll drops it.
    poll_until(lambda: claimed(redis_client, key) == 0, redis_client, key)
    assert redis_client.zcard(companion(key, "pe")) == 1  # its reference's forgetting
    # The reference stays claimed by the dead holder: a copy the broker gives back
    # (its worker died before the body started) claims in its place.
    again = park_admit(redis_client, [SlotLimit("claims", 1, PREFIX)], lease=30,
                       run=run_id("moved", 0), parked=parked.park)
    assert isinstance(again, Lease)
    assert claimed(redis_client, key) == 1
    assert again.release()
    assert claimed(redis_client, key) == 0
    assert redis_client.hget(companion(key, "pr"), run_id("moved", 0)) == b"s"


def test_a_late_release_frees_nobody_elses_slot(redis_client):
    key, _, moved = moved_claim(redis_client, "claims-late", lease=0.3)
    limit = [SlotLimit("claims-late", 1, PREFIX)]
    time.sleep(0.4)  # its lease runs out; the slot is free, and taken by a newcomer
    third = park_admit(redis_client, limit, lease=30, run=run_id("third", 0))
    assert isinstance(third, Lease)
    assert claimed(redis_client, key) == 0  # the admission dropped the lapsed claim
    assert not moved.release()  # the late release: nothing of its own left
    assert moved.handoffs == []
    fourth = park_admit(redis_client, limit, lease=30, run=run_id("fourth", 0))
    assert isinstance(fourth, Busy)  # the newcomer still holds the one slot
    assert redis_client.zcount(key, f"({server_ms(redis_client)}", "+inf") == 1
    # The lapsed claim's reference was not served by the late release: still claimed
    # by its dead holder.
    assert redis_client.hget(companion(key, "pr"), run_id("moved", 0)).startswith(b"c ")
    assert third.release()


def test_a_renewed_lease_keeps_its_claim(redis_client):
    key, _, moved = moved_claim(redis_client, "claims-renewed", lease=0.4)
    moved.lease_seconds = 30.0
    assert moved.renew()
    time.sleep(0.6)  # past the lease it was admitted with
    due(redis_client, {key: 0}, prefix=PREFIX)
    assert claimed(redis_client, key) == 1
    adopted = Lease.adopt(redis_client, moved.handover(), "pool")
    assert adopted is not None
    assert redis_client.zscore(companion(key, "pe"), moved.token) == adopted.expires_at_ms
    assert adopted.release()
    assert claimed(redis_client, key) == 0
    assert redis_client.zcard(companion(key, "pe")) == 0


def test_a_lapsed_claims_reference_is_forgotten_after_the_keep(redis_client):
    key, parked, _ = moved_claim(redis_client, "claims-kept", lease=0.2, keep_ms=300)
    refs = companion(key, "pr")
    poll_until(lambda: redis_client.hget(refs, run_id("moved", 0)) is None, redis_client, key)
    assert claimed(redis_client, key) == 0
    assert redis_client.zcard(companion(key, "pe")) == 0
    # A copy that comes back after that is stale.
    late = park_admit(redis_client, [SlotLimit("claims-kept", 1, PREFIX)], lease=30,
                      run=run_id("moved", 0), parked=parked.park)
    assert isinstance(late, Served)


@pytest.mark.parametrize("keep_ms", [300])
def test_a_copy_parked_again_under_a_live_claim_keeps_its_reference(redis_client, keep_ms):
    key, parked, _ = moved_claim(redis_client, "claims-again", lease=0.3, keep_ms=keep_ms)
    limit = [SlotLimit("claims-again", 1, PREFIX)]
    # A second copy (the claimer's message given back while its lease lives) parks again.
    duplicate = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                           parked=parked.park, keep_served_ms=keep_ms)
    assert isinstance(duplicate, Busy) and duplicate.park == parked.park
    refs = companion(key, "pr")
    poll_until(lambda: claimed(redis_client, key) == 0, redis_client, key)
    time.sleep(keep_ms / 1000 + 0.2)
    due(redis_client, {key: 1}, prefix=PREFIX)
    assert redis_client.hget(refs, run_id("moved", 0)).startswith(b"c ")
    # That copy, moved out of parking, claims in the dead holder's place and runs.
    copy = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                      parked=duplicate.park, keep_served_ms=keep_ms)
    assert isinstance(copy, Lease)
    assert copy.release()
    assert redis_client.hget(refs, run_id("moved", 0)) == b"s"


def test_acks_late_the_copy_that_ran_runs_again_another_copy_does_not(redis_client):
    """Acks late: the release serves the reference with the id of the copy that ran. That
    very copy, given back by the broker (its worker died after the release, before the
    acknowledgement), runs again, as Celery runs it; another copy of the same move (its
    id another) or a copy acking early (no id) ends unrun."""
    key, parked, moved = moved_claim(redis_client, "claims-late-ack", lease=30, copy="c1")
    limit = [SlotLimit("claims-late-ack", 1, PREFIX)]
    refs = companion(key, "pr")
    assert moved.release()
    assert redis_client.hget(refs, run_id("moved", 0)).split()[::2] == [b"s", b"c1"]
    for other in ("c2", ""):
        stale = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                           parked=parked.park, copy=other)
        assert isinstance(stale, Served), other
    again = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                       parked=parked.park, copy="c1")
    assert isinstance(again, Lease)
    assert claimed(redis_client, key) == 1
    # While it runs, a copy of another id goes back to parking (the claim is live).
    duplicate = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                           parked=parked.park, copy="c2")
    assert isinstance(duplicate, Busy) and duplicate.park == parked.park
    assert again.release()
    assert claimed(redis_client, key) == 0
    stale = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                       parked=duplicate.park, copy="c3")
    assert isinstance(stale, Served)


def test_acks_late_the_copy_that_ran_parks_again_behind_a_holder(redis_client):
    """The copy that ran, given back while another run holds the one slot, parks again
    (a new park id; its first 'since' kept), and runs once moved out of parking."""
    key, parked, moved = moved_claim(redis_client, "claims-late-park", lease=30, copy="c1")
    limit = [SlotLimit("claims-late-park", 1, PREFIX)]
    assert moved.release()
    other = park_admit(redis_client, limit, lease=30, run=run_id("other", 0))
    assert isinstance(other, Lease)
    again = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                       parked=parked.park, copy="c1")
    assert isinstance(again, Busy) and again.park is not None
    assert again.park.park_id != parked.park.park_id
    assert other.release()
    assert [h for h in other.handoffs if isinstance(h, ParkedMove)] == [ParkedMove(key)]
    moved_again = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                             parked=again.park, copy="c9")
    assert isinstance(moved_again, Lease)
    assert moved_again.release()
    late = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0),
                      parked=parked.park, copy="c1")
    assert isinstance(late, Served)  # the first copy's id is no longer the one served
