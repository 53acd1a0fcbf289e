"""The lock store's side of the parked line (``engine/parking.py``), step by step as the
model (``tests/waiting_model/store.py``) takes them, on a real redis-server."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, List

import pytest
import redis

from celery_redislock.engine.admission import (
    Busy,
    Lease,
    ParkedMove,
    ParkRef,
    Paused,
    Served,
    SlotLimit,
    declare_fresh,
    handoffs_of,
    owner_prefix,
)
from celery_redislock.engine.parking import (
    ParkAsk,
    due,
    leave,
    moved_nothing,
    park_admit,
    parked_keys,
    prepare_park_admit,
    run_id,
    started,
    started_soon,
)
from celery_redislock.engine.scripts import RELEASE_OWNER

from redis_process import RedisServer

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


def test_started_soon_marks_served_without_waiting(redis_client):
    """The served mark at a body's start is written before the body and not waited for:
    its answer is read with the thread's next request (the first call on a pool waits,
    loading the script); an error answer marks it again, blocking."""
    limiters = [limit("soon")]
    errors: List[Any] = []
    refs = limiters[0].key.replace("}:s:", "}:pr:", 1)
    for n in range(2):  # the first call on the pool waits; the second is sent unwaited
        holder = ask(redis_client, limiters, f"h{n}")
        parked = ask(redis_client, limiters, f"t{n}")
        assert isinstance(holder, Lease) and isinstance(parked, Busy)
        assert holder.release() and holder.handoffs
        moved = ask(redis_client, limiters, f"t{n}", parked=parked.park)
        assert isinstance(moved, Lease)
        started_soon(moved, errors.append)
        # Written already: another connection sees the reference served.
        deadline = time.monotonic() + 5
        while redis_client.hget(refs, run_id(f"t{n}", 0)) != b"s":
            assert time.monotonic() < deadline, redis_client.hget(refs, run_id(f"t{n}", 0))
            time.sleep(0.005)
        assert isinstance(ask(redis_client, limiters, f"t{n}", parked=parked.park), Served)
        assert moved.release()  # reads the answer left unread
    # The script unknown to the server (a restarted store): marked again, blocking.
    holder = ask(redis_client, limiters, "h2")
    parked = ask(redis_client, limiters, "t2")
    assert holder.release()
    moved = ask(redis_client, limiters, "t2", parked=parked.park)
    redis_client.script_flush()
    started_soon(moved, errors.append)
    assert moved.release()
    assert redis_client.hget(refs, run_id("t2", 0)) == b"s"
    assert errors == []


def test_prepare_answers_none_off_the_parked_line(redis_client):
    # nothing to wait for; a rate limit now waits on it too (test_parking_mixed_store.py)
    assert prepare_park_admit(redis_client, [], ParkAsk(lease=5, run="t:0")) is None
    call = prepare_park_admit(redis_client, [limit()], ParkAsk(lease=5, run="t:0"))
    assert call is not None and call.script.name == "admit_parked.lua"
    assert isinstance(call.outcome(call.script.run(redis_client, call.keys, call.args)),
                      Lease)
    assert isinstance(prepare_park_admit(redis_client, [limit()],
                                         ParkAsk(lease=5, run="u:0")).run(), Busy)


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


def test_the_original_given_back_while_its_copy_waits_parks_again(redis_client):
    """A redelivered original (its worker died after publishing the parked copy) parks
    again under a new park id, in the same place: the first parked copy is stale."""
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    first = ask(redis_client, limiters, "t1")
    again = ask(redis_client, limiters, "t1")
    assert isinstance(first, Busy) and isinstance(again, Busy)
    assert again.park.park_id != first.park.park_id
    assert counts(redis_client, key) == {"w": 1}
    holder.release()
    assert moves(holder) == [ParkedMove(key)]
    stale = ask(redis_client, limiters, "t1", parked=first.park)
    assert isinstance(stale, Served)
    # The stale copy used the move: its reservation is given back and handed over again.
    assert moves(stale) == [ParkedMove(key)]
    assert isinstance(ask(redis_client, limiters, "t1", parked=again.park), Lease)


def test_a_claim_whose_holder_died_is_claimed_again(redis_client):
    """A moved copy claimed and its worker died before the body started: the broker
    gives the copy back; once the claimer's lease ran out it claims in its place."""
    limiters = [limit()]
    holder = ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1")
    holder.release()
    claimer = ask(redis_client, limiters, "t1", parked=waiter.park, lease=0.2)
    assert isinstance(claimer, Lease)
    back = ask(redis_client, limiters, "t1", parked=waiter.park)
    assert isinstance(back, Busy) and back.park == waiter.park  # its claimer lives
    time.sleep(0.25)
    redelivered = ask(redis_client, limiters, "t1", parked=waiter.park)
    assert isinstance(redelivered, Lease)
    redelivered.release()  # acks late: the release serves the reference
    assert isinstance(ask(redis_client, limiters, "t1", parked=waiter.park), Served)


def test_a_claim_whose_holder_died_parks_behind_the_line(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1")
    holder.release()
    claimer = ask(redis_client, limiters, "t1", parked=waiter.park, lease=0.2)
    assert isinstance(claimer, Lease)
    behind = ask(redis_client, limiters, "t2")
    assert isinstance(behind, Busy)
    time.sleep(0.25)
    # t2 waits, the slot is free: the claim's copy parks again (a new park id), behind t2.
    back = ask(redis_client, limiters, "t1", parked=waiter.park)
    assert isinstance(back, Busy) and back.park.park_id != waiter.park.park_id
    assert counts(redis_client, key) == {"w": 2}


def test_served_references_are_forgotten_after_keep_served(redis_client):
    limiters = [limit()]
    holder = ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1", keep_served_ms=100)
    holder.release()
    claimer = ask(redis_client, limiters, "t1", parked=waiter.park, keep_served_ms=100)
    assert started(claimer) == 1
    claimer.release()
    assert isinstance(ask(redis_client, limiters, "t1"), Served)
    time.sleep(0.15)
    ask(redis_client, limiters, "t9").release()  # any call prunes a few
    refs = limiters[0].key.replace("}:s:", "}:pr:", 1)
    assert not redis_client.hexists(refs, run_id("t1", 0))


def test_an_operator_override_of_the_slots_is_handed_over(redis_client):
    limiters = [limit(slots=1)]
    key = limiters[0].key
    ask(redis_client, limiters, "t0")
    parked = [ask(redis_client, limiters, f"t{i}") for i in (1, 2, 3)]
    assert all(isinstance(outcome, Busy) for outcome in parked)
    redis_client.hset(key.replace("}:s:", "}:cs:", 1), "slots", 3)
    assert due(redis_client, {key: 3}) == [ParkedMove(key)] * 2
    assert [type(ask(redis_client, limiters, f"t{i}", parked=parked[i - 1].park)).__name__
            for i in (1, 2, 3)] == ["Lease", "Lease", "Busy"]


def test_a_pause_holds_the_hand_overs_until_it_ends(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1")
    control = key.replace("}:s:", "}:cs:", 1)
    redis_client.hset(control, "paused_until", "forever")
    holder.release()
    assert moves(holder) == []
    assert due(redis_client, {key: 1}) == []
    assert isinstance(ask(redis_client, limiters, "t1", parked=waiter.park), Paused)
    redis_client.hdel(control, "paused_until")
    assert due(redis_client, {key: 1}) == [ParkedMove(key)]


def test_several_semaphores_all_or_nothing_parking_at_the_first_refusal(redis_client):
    """A global cap of 2 and a tenant's key of 1. A moved copy refused by the global cap
    parks there; the tenant's reservation is given back (nobody else waits there)."""
    overall, tenant_a = limit("all", 2), limit("tenant-a", 1)
    tenant_b, tenant_c = limit("tenant-b", 1), limit("tenant-c", 1)
    a0 = ask(redis_client, [overall, tenant_a], "a0")
    assert isinstance(a0, Lease)
    a1 = ask(redis_client, [overall, tenant_a], "a1")
    assert isinstance(a1, Busy) and a1.park.key == tenant_a.key
    assert redis_client.zcount(overall.key, "(0", "+inf") == 1  # nothing taken by a1
    b0 = ask(redis_client, [overall, tenant_b], "b0")
    assert isinstance(b0, Lease)
    a0.release()
    assert moves(a0) == [ParkedMove(tenant_a.key)]
    c0 = ask(redis_client, [overall, tenant_c], "c0")  # the global cap has a free slot
    assert isinstance(c0, Lease)
    moved = ask(redis_client, [overall, tenant_a], "a1", parked=a1.park)
    assert isinstance(moved, Busy) and moved.park.key == overall.key
    assert counts(redis_client, tenant_a.key) == {"w": 0}
    assert counts(redis_client, overall.key) == {"w": 1}
    assert redis_client.zcard(tenant_a.key.replace("}:s:", "}:pv:", 1)) == 0
    b0.release()
    assert moves(b0) == [ParkedMove(overall.key)]
    admitted = ask(redis_client, [overall, tenant_a], "a1", parked=moved.park)
    assert isinstance(admitted, Lease)
    assert redis_client.zcount(tenant_a.key, "(0", "+inf") == 1


def test_a_moved_copy_refused_elsewhere_hands_its_reservation_to_the_next(redis_client):
    overall, tenant_a = limit("all", 1), limit("tenant-a", 1)
    a0 = ask(redis_client, [tenant_a], "a0")
    a1 = ask(redis_client, [overall, tenant_a], "a1")
    a2 = ask(redis_client, [tenant_a], "a2")
    assert isinstance(a1, Busy) and a1.park.key == tenant_a.key
    assert isinstance(a2, Busy) and a2.park.key == tenant_a.key
    holder = ask(redis_client, [overall], "g0")
    assert isinstance(holder, Lease)
    a0.release()
    assert moves(a0) == [ParkedMove(tenant_a.key)]
    # The parking queue is first in first out: a1's copy comes out first.
    moved = ask(redis_client, [overall, tenant_a], "a1", parked=a1.park)
    assert isinstance(moved, Busy) and moved.park.key == overall.key
    assert moves(moved) == [ParkedMove(tenant_a.key)]  # handed to a2
    assert isinstance(ask(redis_client, [tenant_a], "a2", parked=a2.park), Lease)


def _reconnect(client: Any) -> None:
    """The first command after a restart may meet the connection the restart broke (the
    client's, and the engine's channel, which scripts go through)."""
    for _ in range(2):
        try:
            client.ping()
            moved_nothing(client, PREFIX + "{none}:s:none")
        except redis.ConnectionError:
            continue


def _kill_and_start(server: RedisServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.start()


def test_a_restart_with_its_data_keeps_the_line(tmp_path):
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    try:
        client = server.client()
        declare_fresh(client)
        limiters = [limit()]
        key = limiters[0].key
        holder = ask(client, limiters, "t0", lease=30)
        waiters = [ask(client, limiters, f"t{i}") for i in (1, 2)]
        holder.release()
        assert moves(holder) == [ParkedMove(key)]
        _kill_and_start(server)
        _reconnect(client)
        assert counts(client, key) == {"w": 2}
        assert due(client, {key: 2}) == []  # the reservation survived
        first = ask(client, limiters, "t1", parked=waiters[0].park)
        assert isinstance(first, Lease)
        first.release()
        assert moves(first) == [ParkedMove(key)]
        assert isinstance(ask(client, limiters, "t2", parked=waiters[1].park), Lease)
        assert isinstance(ask(client, limiters, "t1", parked=waiters[0].park), Served)
        client.close()
    finally:
        server.cleanup()


def test_a_restart_without_data_counts_the_parking_queues(own_redis_server):
    """The store restarts empty: the line knows nobody, the poll counts the parking
    queue's messages as anonymous entries; nothing is granted in the grace; then a copy
    parked in the lost incarnation takes a reservation like any."""
    client = own_redis_server.client()
    declare_fresh(client)
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(client, limiters, "t0", lease=1)
    assert isinstance(holder, Lease)
    waiter = ask(client, limiters, "t1", lease=1)
    assert isinstance(waiter, Busy)
    own_redis_server.restart()  # empty: it keeps nothing on disk
    _reconnect(client)
    assert due(client, {key: 1}) == []  # counted, but the grace is on
    assert counts(client, key) == {"a": 1}
    newcomer = ask(client, limiters, "t2", lease=1)
    assert isinstance(newcomer, Busy)  # in the grace: it parks
    assert counts(client, key) == {"a": 1, "w": 1}
    deadline = time.monotonic() + 5
    owed: List[ParkedMove] = []
    while not owed and time.monotonic() < deadline:
        owed = due(client, {key: 2})
        time.sleep(0.05)
    assert owed == [ParkedMove(key)]
    lost = ask(client, limiters, "t1", parked=waiter.park, lease=1)
    assert isinstance(lost, Lease)
    assert counts(client, key) == {"a": 0, "w": 1}
    lost.release()
    assert moves(lost) == [ParkedMove(key)]
    assert isinstance(ask(client, limiters, "t2", parked=newcomer.park, lease=1), Lease)
    client.close()


def test_a_copy_of_a_lost_incarnation_with_no_reservation_asks_as_a_newcomer(
        own_redis_server):
    client = own_redis_server.client()
    declare_fresh(client)
    limiters = [limit()]
    key = limiters[0].key
    ask(client, limiters, "t0", lease=0.3)
    waiter = ask(client, limiters, "t1", lease=0.3)
    own_redis_server.restart()
    _reconnect(client)
    assert due(client, {key: 1}) == []
    time.sleep(0.35)  # the grace (the longest lease) ends
    lost = ask(client, limiters, "t1", parked=waiter.park, lease=0.3)
    assert isinstance(lost, Lease)  # the anonymous entry was its own
    assert counts(client, key) == {"a": 0}
    client.close()


def test_a_moved_copy_that_leaves_hands_its_reservation_over(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    revoked = ask(redis_client, limiters, "t1")
    waiter = ask(redis_client, limiters, "t2")
    holder.release()
    assert moves(holder) == [ParkedMove(key)]
    assert leave(redis_client, revoked.park, run_id("t1", 0)) == [ParkedMove(key)]
    assert counts(redis_client, key) == {"w": 1}
    assert isinstance(ask(redis_client, limiters, "t2", parked=waiter.park), Lease)


def line_of_a_lost_copy(redis_client: Any) -> Any:
    """A line whose one reference waits while its parking queue is empty: the move
    after the holder's release found nothing, and the poll has just handed the slot over
    again (a move in flight). Returns the limiters, the key and the line's counts."""
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    ask(redis_client, limiters, "t1")
    holder.release()
    assert moved_nothing(redis_client, key)
    assert due(redis_client, {key: 0}) == [ParkedMove(key)]
    return limiters, key, key.replace("}:s:", "}:pn:", 1)


def test_a_line_whose_copies_are_gone_is_counted_empty_again(redis_client):
    """References wait, nothing is reserved, the parking queue stays empty (the broker
    lost the copies): after a minute the poll clears the count, and newcomers pass."""
    limiters, key, names = line_of_a_lost_copy(redis_client)
    assert moved_nothing(redis_client, key)
    assert due(redis_client, {key: 0}) == [ParkedMove(key)]
    moved_nothing(redis_client, key)
    seen_empty = int(redis_client.hget(names, "e"))
    redis_client.hset(names, "e", seen_empty - 61_000)  # a minute ago
    assert due(redis_client, {key: 0}) == []
    assert counts(redis_client, key)["w"] == 0
    assert parked_keys(redis_client) == []  # and it left the poll's index
    assert isinstance(ask(redis_client, limiters, "t9"), Lease)


def test_a_poll_during_a_move_in_flight_does_not_restart_the_empty_line_minute(redis_client):
    """A moved copy is lost (kombu's window: the worker that popped it was killed): its
    reference waits, its parking queue stays empty. Every poll hands the free slot over,
    reserving it until the move that finds the queue empty gives it back, so another
    worker's poll nearly always sees a live reservation: that must not restart the
    minute after which the count is cleared (else the line churns empty moves for
    ever, and never counts empty again)."""
    limiters, key, names = line_of_a_lost_copy(redis_client)  # a move in flight
    seen_empty = int(redis_client.hget(names, "e"))
    redis_client.hset(names, "e", seen_empty - 61_000)  # a minute ago
    assert due(redis_client, {key: 0}) == []  # another worker's poll: the slot is reserved
    assert redis_client.hget(names, "e") is not None
    assert counts(redis_client, key)["w"] == 1  # not cleared while a slot is reserved
    assert moved_nothing(redis_client, key)  # the move found the queue empty
    assert due(redis_client, {key: 0}) == []
    assert counts(redis_client, key)["w"] == 0
    assert isinstance(ask(redis_client, limiters, "t9"), Lease)


def test_a_paused_semaphore_can_park_the_run(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    control = key.replace("}:s:", "}:cs:", 1)
    redis_client.hset(control, "paused_until", "forever")
    parked = ask(redis_client, limiters, "t0", park_paused=True)
    assert isinstance(parked, Busy) and parked.park is not None
    assert parked.retry_hint == 0
    assert due(redis_client, {key: 1}) == []
    redis_client.hdel(control, "paused_until")
    assert due(redis_client, {key: 1}) == [ParkedMove(key)]
    assert isinstance(ask(redis_client, limiters, "t0", parked=parked.park), Lease)


def test_the_first_poll_after_a_loss_counts_what_no_reference_waits_for(own_redis_server):
    """The store restarts empty and a newcomer parks before any poll: the poll still
    counts the parking queue's other messages (the queue's length less the references)
    as anonymous entries, and hands over one slot per message."""
    client = own_redis_server.client()
    declare_fresh(client)
    limiters = [limit(slots=3)]
    key = limiters[0].key
    holders = [ask(client, limiters, f"h{i}", lease=0.3) for i in range(3)]
    before = [ask(client, limiters, f"t{i}", lease=0.3) for i in range(2)]
    assert all(isinstance(outcome, Busy) for outcome in before)
    assert all(isinstance(outcome, Lease) for outcome in holders)
    own_redis_server.restart()
    _reconnect(client)
    newcomer = ask(client, limiters, "t9", lease=0.3)
    assert isinstance(newcomer, Busy)  # in the grace
    time.sleep(0.35)
    owed = due(client, {key: 3})  # two copies of before the loss, and the newcomer's
    assert owed == [ParkedMove(key)] * 3
    assert counts(client, key) == {"w": 1, "a": 2}
    assert isinstance(ask(client, limiters, "t0", parked=before[0].park, lease=0.3), Lease)
    assert isinstance(ask(client, limiters, "t1", parked=before[1].park, lease=0.3), Lease)
    assert isinstance(ask(client, limiters, "t9", parked=newcomer.park, lease=0.3), Lease)
    assert counts(client, key) == {"w": 0, "a": 0}
    client.close()


def test_a_poll_that_saw_no_incarnation_starts_none(own_redis_server):
    """A process that never saw the store's incarnation (just started) finds it missing:
    it writes none and hands nothing over (the store may have lost its data: the grace
    is the admissions' to start)."""
    client = own_redis_server.client()
    limiters = [limit()]
    key = limiters[0].key
    assert due(client, {key: 3}) == []
    assert not client.exists(PREFIX + "incarnation")
    assert counts(client, key) == {}
    client.close()


def test_an_uncontended_lease_hands_over_to_a_line_formed_meanwhile(redis_client):
    """A lease taken while nobody waited is released with a plain ZREM; a line that
    formed meanwhile is handed the slot (wake.lua) as a ParkedMove."""
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    assert isinstance(holder, Lease) and not holder._contended
    waiter = ask(redis_client, limiters, "t1")
    assert isinstance(waiter, Busy)
    handed: List[Any] = []
    assert holder.release_handing_over(handed.extend)
    assert handed == [ParkedMove(key)]


def test_a_parked_lease_renews_is_adopted_and_freed_by_its_owner_prefix(redis_client):
    limiters = [limit()]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "t0")
    waiter = ask(redis_client, limiters, "t1")
    holder.release()
    claim = ask(redis_client, limiters, "t1", parked=waiter.park,
                owner=owner_prefix("w1@host", "t1", "5eed"))
    assert isinstance(claim, Lease) and claim.renew()
    adopted = Lease.adopt(redis_client, claim.handover(), '{"pid": 7}')
    assert adopted is not None and adopted.renew()
    # The worker's recovery frees what a dead pool process held, by the token's prefix:
    # the reference stays claimed; its copy, given back, claims in its place.
    assert free_by_prefix(redis_client, key, owner_prefix("w1@host", "t1")) == 1
    again = ask(redis_client, limiters, "t1", parked=waiter.park)
    assert isinstance(again, Lease)
    assert again.release() and not adopted.release()
    assert isinstance(ask(redis_client, limiters, "t1", parked=waiter.park), Served)


def free_by_prefix(client: Any, key: str, prefix: str) -> int:
    return int(RELEASE_OWNER.run(client, [key], [prefix, 10000])[0])


def test_handoffs_of_reads_moves_among_messages():
    assert handoffs_of(["!move 2 k", b"@h m:t\n{}", b"!move 1 j"]) == [
        ParkedMove("k"), ParkedMove("k"), b"@h m:t\n{}", ParkedMove("j")]


def test_lines_that_wait_for_each_others_reservations_still_move(redis_client):
    """A global cap of 2 and tenants a and b of 1: each tenant's slot is reserved for a run
    that also needs the global cap, whose slots are reserved for runs that need a tenant.
    A copy that took its home's reservation takes the other's (no body holds it) and
    runs; the copy moved for that one parks again."""
    overall, tenant_a, tenant_b = limit("all", 2), limit("a", 1), limit("b", 1)
    holds_b = ask(redis_client, [tenant_b], "hb")
    p = ask(redis_client, [overall, tenant_b], "p")
    holds_a = ask(redis_client, [tenant_a], "ha")
    q = ask(redis_client, [overall, tenant_a], "q")
    holds_all = [ask(redis_client, [overall], f"h{i}") for i in (1, 2)]
    x = ask(redis_client, [overall, tenant_b], "x")
    y = ask(redis_client, [overall, tenant_a], "y")
    assert (p.park.key, q.park.key) == (tenant_b.key, tenant_a.key)
    assert (x.park.key, y.park.key) == (overall.key, overall.key)
    for lease in (holds_b, holds_a, *holds_all):
        lease.release()
    assert isinstance(ask(redis_client, [overall, tenant_b], "x", parked=x.park), Lease)
    assert isinstance(ask(redis_client, [overall, tenant_a], "y", parked=y.park), Lease)
    again = ask(redis_client, [overall, tenant_b], "p", parked=p.park)
    assert isinstance(again, Busy) and again.park.key == tenant_b.key
