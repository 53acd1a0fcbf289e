"""The lock store's side of the parked line (``engine/parking.py``), step by step as the
model (``tests/waiting_model/store.py``) takes them, on a real redis-server."""

from __future__ import annotations

import time
from typing import Any, List

import pytest

from celery_redislock.engine.admission import (
    Busy,
    Lease,
    ParkedMove,
    ParkRef,
    Paused,
    Served,
    SlotLimit,
)
from celery_redislock.engine.parking import (
    due,
    moved_nothing,
    park_admit,
    parked_keys,
    prepare_park_admit,
    run_id,
    started,
)

PREFIX = "redislock:"


def limit(name: str = "parked", slots: int = 1) -> SlotLimit:
    return SlotLimit(name, slots, PREFIX)


def ask(client: Any, limiters: List[SlotLimit], task: str, parked: Any = None,
        attempt: int = 0, **options: Any) -> Any:
    return park_admit(client, limiters, lease=options.pop("lease", 5),
                      run=run_id(task, attempt), parked=parked, **options)


def counts(client: Any, key: str) -> dict:
    names = key.replace("}:s:", "}:pn:", 1)
    return {k.decode(): int(v) for k, v in client.hgetall(names).items()
            if k.decode() in ("w", "a")}


def moves(outcome: Any) -> List[ParkedMove]:
    return [entry for entry in outcome.handoffs if isinstance(entry, ParkedMove)]


def test_a_newcomer_takes_a_free_slot_and_a_refusal_parks(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    first = ask(redis_client, limiters, "t0")
    assert isinstance(first, Lease)
    second = ask(redis_client, limiters, "t1")
    assert isinstance(second, Busy) and second.park is not None
    assert second.park.key == key and ":" in second.park.park_id
    assert counts(redis_client, key) == {"w": 1}
    assert parked_keys(redis_client) == [key]
    # The release reserves the slot for the line and owes one move.
    assert first.release()
    assert first.handoffs == [ParkedMove(key)]
    # A newcomer does not overtake: the slot is reserved, and the line has a waiter.
    third = ask(redis_client, limiters, "t2")
    assert isinstance(third, Busy) and third.park is not None
    # The moved copy takes the reservation; its reference is claimed.
    moved = ask(redis_client, limiters, "t1", parked=second.park)
    assert isinstance(moved, Lease)
    assert counts(redis_client, key) == {"w": 1}
    # A second copy of t1 (the same park id) finds the reference claimed by a live holder:
    # back to parking, unchanged.
    again = ask(redis_client, limiters, "t1", parked=second.park)
    assert isinstance(again, Busy) and again.park == second.park
    # Started (default acks): served; any copy of it then ends unrun.
    assert started(moved) == 1
    assert isinstance(ask(redis_client, limiters, "t1", parked=second.park), Served)
    assert isinstance(ask(redis_client, limiters, "t1"), Served)


def test_prepare_answers_none_off_the_parked_line(redis_client):
    assert prepare_park_admit(redis_client, [SlotLimit("w", 3, PREFIX, cost=2)], lease=5,
                              run="t:0") is None
    call = prepare_park_admit(redis_client, [limit()], lease=5, run="t:0")
    assert call is not None and call.script.name == "admit_parked.lua"
    assert isinstance(call.outcome(call.script.run(redis_client, call.keys, call.args)),
                      Lease)


def test_due_hands_over_a_slot_whose_lease_ran_out(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0", lease=0.2)
    assert isinstance(holder, Lease)
    waiter = ask(redis_client, limiters, "t1")
    assert isinstance(waiter, Busy)
    assert due(redis_client, {key: 1}) == []
    time.sleep(0.25)
    assert due(redis_client, {key: 1}) == [ParkedMove(key)]
    assert due(redis_client, {key: 1}) == []  # reserved: owed once
    assert isinstance(ask(redis_client, limiters, "t1", parked=waiter.park), Lease)


def test_moved_nothing_gives_the_reservation_back(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1")
    assert isinstance(holder, Lease) and isinstance(waiter, Busy)
    holder.release()
    assert moves(holder) == [ParkedMove(key)]
    assert moved_nothing(redis_client, key)
    assert not moved_nothing(redis_client, key)
    assert due(redis_client, {key: 0}) == [ParkedMove(key)]  # the reference still waits


def test_a_pause_refuses_and_writes_nothing(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    redis_client.hset(key.replace("}:s:", "}:cs:", 1), "paused_until", "forever")
    outcome = ask(redis_client, limiters, "t0")
    assert isinstance(outcome, Paused)
    assert counts(redis_client, key) == {}


@pytest.mark.parametrize("park_id", ["1:1", "0:0"])
def test_a_copy_whose_reference_names_another_park_id_is_stale(redis_client, park_id):
    limiters = [limit()]
    key = limiters[0].key
    ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1")
    assert isinstance(waiter, Busy)
    incarnation = waiter.park.park_id.split(":")[0]
    stale = ParkRef(key, f"{incarnation}:{park_id.split(':')[1]}999")
    assert isinstance(ask(redis_client, limiters, "t1", parked=stale), Served)
