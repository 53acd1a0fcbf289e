"""The lock store's side of the parked line for a run of semaphores AND rate limits, of
several rate limits, or of a rate of cost > 1 (lua/parked_rates.lua in admit_parked.lua),
on a real redis-server: all or nothing in one script; a rate that refuses parks the run
at its rate line with a promised start, the semaphores untouched; a copy moved from the
rate line asks the semaphores as a newcomer and, refused, keeps its turn."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from celery_redislock.engine.admission import Busy, Lease, ParkRef, RateLimit, Served, SlotLimit
from celery_redislock.engine.parking import DeadlineMove, GaveUp, due, park_admit, run_id
from celery_redislock.engine.parking_rate import due_rate
from celery_redislock.engine.rate import Rate

PREFIX = "redislock:"


def rate(name: str, spec: str, burst: int = 0, cost: int = 1) -> RateLimit:
    return RateLimit(name, Rate.parse(spec, burst=burst), PREFIX, cost)


def holders(client: Any, key: str) -> int:
    now_ms = int(time.time() * 1000)
    return sum(1 for member, score in client.zrange(key, 0, -1, withscores=True)
               if score > now_ms and b" " in member)


def test_a_rate_that_refuses_parks_the_run_at_the_rate_and_holds_no_slot(
        redis_client: Any) -> None:
    slots, per_s = SlotLimit("mixed", 2, PREFIX), rate("mixed", "5/s")
    first = park_admit(redis_client, [slots, per_s], lease=5, run=run_id("a", 0))
    assert isinstance(first, Lease)
    second = park_admit(redis_client, [slots, per_s], lease=5, run=run_id("b", 0))
    assert isinstance(second, Busy) and second.park is not None
    assert second.park.key == per_s.key and 0.15 <= second.retry_hint <= 0.2
    assert holders(redis_client, slots.key) == 1  # all or nothing: no slot held for b
    assert redis_client.llen(per_s.key + ":pq") == 1
    # A newcomer goes behind b's promise at every rate.
    third = park_admit(redis_client, [slots, per_s], lease=5, run=run_id("c", 0))
    assert isinstance(third, Busy) and third.park.key == per_s.key
    assert 0.35 <= third.retry_hint <= 0.4
    assert first.release()


def test_full_semaphores_park_the_run_there_and_take_no_start(redis_client: Any) -> None:
    slots, per_s = SlotLimit("full", 1, PREFIX), rate("full", "5/s", burst=4)
    held = park_admit(redis_client, [slots, per_s], lease=5, run=run_id("a", 0))
    assert isinstance(held, Lease)
    tat = redis_client.hget(per_s.key, "tat")
    refused = park_admit(redis_client, [slots, per_s], lease=5, run=run_id("b", 0))
    assert isinstance(refused, Busy) and refused.park.key == slots.key
    assert redis_client.hget(per_s.key, "tat") == tat  # no start counted for b
    assert held.release() and held.handoffs  # its slot is handed to b's line
    moved = park_admit(redis_client, [slots, per_s], lease=5, run=run_id("b", 0),
                       parked=refused.park)
    assert isinstance(moved, Lease) and moved.release()


def test_a_copy_moved_from_the_rate_line_keeps_its_turn_at_a_full_semaphore(
        redis_client: Any) -> None:
    slots, per_s = SlotLimit("turn", 2, PREFIX), rate("turn", "5/s")
    a = park_admit(redis_client, [slots, per_s], lease=5, run="a:0")
    assert isinstance(a, Lease)
    b = park_admit(redis_client, [slots, per_s], lease=5, run="b:0")
    assert isinstance(b, Busy) and b.park.key == per_s.key
    filler = park_admit(redis_client, [slots], lease=5, run="f:0")  # slots only
    assert isinstance(filler, Lease)  # nobody waits at the semaphore: b waits at the rate
    deadline = time.monotonic() + 3
    while not due_rate(redis_client, {per_s.key: 1}, prefix=PREFIX):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.25)  # b's start has come (the poll moves 0.4 s ahead)
    at_slots = park_admit(redis_client, [slots, per_s], lease=5, run="b:0", parked=b.park)
    assert isinstance(at_slots, Busy) and at_slots.park.key == slots.key
    # A redelivery of the copy moved from the rate line is stale.
    assert isinstance(park_admit(redis_client, [slots, per_s], lease=5, run="b:0",
                                 parked=b.park), Served)
    # Newcomers get starts at the end of the line meanwhile (b keeps its own).
    for name in ("c:0", "d:0"):
        outcome = park_admit(redis_client, [slots, per_s], lease=5, run=name)
        assert isinstance(outcome, Busy) and outcome.park.key == slots.key
    assert a.release()
    moved = park_admit(redis_client, [slots, per_s], lease=5, run="b:0",
                       parked=at_slots.park)
    assert isinstance(moved, Lease)  # its turn: only the GCRA, which allows it now
    assert redis_client.hget(per_s.key + ":pr", "b:0") == b"s"
    assert moved.release()


def test_two_rates_and_a_cost_are_all_or_nothing(redis_client: Any) -> None:
    fast, slow = rate("fast", "10/s"), rate("slow", "2/s", cost=2, burst=1)
    a = park_admit(redis_client, [fast, slow], lease=5, run="a:0")
    assert isinstance(a, Lease)
    b = park_admit(redis_client, [fast, slow], lease=5, run="b:0")
    # cost 2 of 2/s (burst 1): the next start 1 s later, set by the slow rate
    assert isinstance(b, Busy) and b.park.key == slow.key and 0.9 <= b.retry_hint <= 1.0
    # b's start is its own at every rate: a newcomer of the fast rate alone waits past it
    x = park_admit(redis_client, [fast], lease=5, run="x:0")
    assert isinstance(x, Busy) and x.park.key == fast.key and x.retry_hint >= 0.99
    assert a.release() is not None


def test_forty_runs_under_two_slots_and_five_per_second(redis_client: Any) -> None:
    slots, per_s = SlotLimit("sim", 2, PREFIX), rate("sim", "5/s", burst=1)
    limits = [slots, per_s]
    queues: Dict[str, List[Tuple[str, ParkRef]]] = {slots.key: [], per_s.key: []}
    running: List[Tuple[float, str, Lease]] = []
    started: Dict[str, float] = {}
    peak = 0

    def ask(name: str, parked: Optional[ParkRef]) -> None:
        outcome = park_admit(redis_client, limits, lease=10, run=name, parked=parked)
        if isinstance(outcome, Lease):
            assert name not in started
            started[name] = outcome.acquired_at_ms / 1000.0
            running.append((time.monotonic() + 0.3, name, outcome))
            owe(outcome.handoffs)
        elif isinstance(outcome, Busy):
            assert outcome.park is not None
            queues[outcome.park.key].append((name, outcome.park))
            owe(outcome.handoffs)
        else:
            assert isinstance(outcome, Served), outcome

    def owe(moves: List[Any]) -> None:
        for move in moves:
            if getattr(move, "key", None) in queues and queues[move.key]:
                ask(*queues[move.key].pop(0))

    for i in range(40):
        ask(f"r{i}:0", None)
    deadline = time.monotonic() + 30
    while len(started) < 40:
        assert time.monotonic() < deadline, (len(started), {k: len(v) for k, v in queues.items()})
        now = time.monotonic()
        for entry in [entry for entry in running if entry[0] <= now]:
            running.remove(entry)
            assert entry[2].release()
            owe(entry[2].handoffs)
        peak = max(peak, len(running))
        owe(due(redis_client, {slots.key: len(queues[slots.key])}, prefix=PREFIX))
        owe(due_rate(redis_client, {per_s.key: len(queues[per_s.key])}, prefix=PREFIX))
        time.sleep(0.02)
    assert peak <= 2
    times = sorted(started.values())
    worst = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert worst <= 5 + 1, worst
    assert not queues[slots.key] and not queues[per_s.key]


def test_a_paused_rate_parks_the_run_with_no_promise_until_it_ends(redis_client: Any) -> None:
    slots, per_s = SlotLimit("paused", 2, PREFIX), rate("paused", "5/s")
    control = per_s.key.replace("}:r:", "}:cr:", 1)
    redis_client.hset(control, "paused_until", "forever")
    parked = park_admit(redis_client, [slots, per_s], lease=5, run="p:0")
    assert isinstance(parked, Busy) and parked.park is not None
    assert parked.park.key == per_s.key and holders(redis_client, slots.key) == 0
    assert not due_rate(redis_client, {per_s.key: 1}, prefix=PREFIX)  # no start yet
    redis_client.hdel(control, "paused_until")
    deadline = time.monotonic() + 3
    while not due_rate(redis_client, {per_s.key: 1}, prefix=PREFIX):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    moved = park_admit(redis_client, [slots, per_s], lease=5, run="p:0", parked=parked.park)
    assert isinstance(moved, Lease) and moved.release()


def test_a_max_wait_at_the_rate_line_gives_the_run_up_all_or_nothing(
        redis_client: Any) -> None:
    """Two slots and 1 per 10 s, a max wait of 0.3 s: b and c park at the rate (no slot
    held). Past their deadline the poll owes deadline moves of the rate line; each copy
    is given up (nothing held, its start back to the line: the line is empty again), and
    a redelivered copy of it ends unrun."""
    slots, per_10s = SlotLimit("late", 2, PREFIX), rate("late", "1/10s")
    first = park_admit(redis_client, [slots, per_10s], lease=5, run=run_id("a", 0),
                       max_wait=0.3)
    assert isinstance(first, Lease)
    parks = []
    for name in "bc":
        refused = park_admit(redis_client, [slots, per_10s], lease=5, run=run_id(name, 0),
                             max_wait=0.3)
        assert isinstance(refused, Busy) and refused.park.key == per_10s.key
        parks.append(refused.park)
    time.sleep(0.35)
    moves = due_rate(redis_client, {per_10s.key: 2}, prefix=PREFIX)
    assert moves == [DeadlineMove(per_10s.key)] * 2
    for name, park in zip("bc", parks):
        outcome = park_admit(redis_client, [slots, per_10s], lease=5, run=run_id(name, 0),
                             parked=park, max_wait=0.3)
        assert isinstance(outcome, GaveUp) and outcome.key == per_10s.key, outcome
        assert isinstance(park_admit(redis_client, [slots, per_10s], lease=5,
                                     run=run_id(name, 0), parked=park, max_wait=0.3), Served)
    assert holders(redis_client, slots.key) == 1
    assert redis_client.llen(per_10s.key + ":pq") == 0
    line_us = int(redis_client.hget(per_10s.key, "line"))
    tat_us = int(redis_client.hget(per_10s.key, "tat"))
    assert line_us <= tat_us  # the given-up runs' starts are the line's again
    assert first.release()
