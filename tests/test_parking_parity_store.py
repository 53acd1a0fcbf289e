"""The lock store's side of the parked line's parity with today's line (a run's
``lock_max_wait``; weighted runs), on a private redis-server."""

from __future__ import annotations

import time
from typing import Any, List

from celery_redislock.engine.admission import Busy, Lease, SlotLimit
from celery_redislock.engine.parking import (
    DeadlineMove,
    GaveUp,
    due,
    moved_nothing,
    park_admit,
    run_id,
)

PREFIX = "redislock:"


def limit(name: str, slots: int = 1) -> SlotLimit:
    return SlotLimit(name, slots, PREFIX)


def ask(client: Any, limiters: List[SlotLimit], task: str, parked: Any = None,
        **options: Any) -> Any:
    return park_admit(client, limiters, lease=options.pop("lease", 30),
                      run=run_id(task, 0), parked=parked, **options)


def deadlines(client: Any, key: str) -> List[bytes]:
    return client.zrange(key.replace("}:s:", "}:pd:", 1), 0, -1)


def test_a_run_parked_past_its_max_wait_is_moved_by_the_poll_and_given_up(redis_client):
    limiters = [limit("max-wait")]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "h")
    assert isinstance(holder, Lease)
    parked = [ask(redis_client, limiters, f"w{i}", max_wait=0.3) for i in range(3)]
    assert all(isinstance(p, Busy) and p.park for p in parked)
    assert len(deadlines(redis_client, key)) == 3
    # Before the deadline the poll owes nothing.
    assert due(redis_client, {key: 3}) == []
    time.sleep(0.35)
    # Past it: one deadline move per run due (no slot reserved), none again in flight.
    assert due(redis_client, {key: 3}) == [DeadlineMove(key)] * 3
    assert due(redis_client, {key: 3}) == []
    # The head's copy comes back: given up, its reference and deadline dropped.
    gave_up = ask(redis_client, limiters, "w0", parked=parked[0].park, max_wait=0.3)
    assert isinstance(gave_up, GaveUp) and gave_up.waited >= 0.3
    assert gave_up.handoffs == []
    assert redis_client.hget(key.replace("}:s:", "}:pr:", 1), run_id("w0", 0)) is None
    assert len(deadlines(redis_client, key)) == 2
    assert due(redis_client, {key: 2}) == []  # two more in flight
    # A release while they are in flight reserves the slot for the line.
    holder.release()
    assert len(holder.handoffs) == 1
    for task, parked_run in (("w1", parked[1]), ("w2", parked[2])):
        assert isinstance(ask(redis_client, limiters, task, parked=parked_run.park,
                              max_wait=0.3), GaveUp)
    assert deadlines(redis_client, key) == []
    # The release's move finds the parking queue empty: its reservation is given back.
    assert moved_nothing(redis_client, key)
    # Nothing is held, nothing waits: a newcomer takes the slot.
    assert isinstance(ask(redis_client, limiters, "n"), Lease)


def test_a_run_whose_deadline_has_not_passed_parks_again_keeping_its_since(redis_client):
    limiters = [limit("mixed-wait")]
    key = limiters[0].key
    assert isinstance(ask(redis_client, limiters, "h"), Lease)
    long = ask(redis_client, limiters, "long", max_wait=60)
    short = ask(redis_client, limiters, "short", max_wait=0.2)
    time.sleep(0.25)
    assert due(redis_client, {key: 2}) == [DeadlineMove(key)]
    # The head is the run with the longer max wait: it parks again at the end.
    again = ask(redis_client, limiters, "long", parked=long.park, max_wait=60)
    assert isinstance(again, Busy) and again.park and again.park.park_id != long.park.park_id
    assert again.handoffs == []
    # The move was owed for the run due, which still waits: the next poll owes it one
    # again (not once the first has been in flight 0.5 s), and only one.
    assert due(redis_client, {key: 2}) == [DeadlineMove(key)]
    assert due(redis_client, {key: 2}) == []
    assert isinstance(ask(redis_client, limiters, "short", parked=short.park, max_wait=0.2),
                      GaveUp)
    assert deadlines(redis_client, key) == [run_id("long", 0).encode()]  # not owed: 60 s


def test_a_copy_due_by_the_time_it_comes_leaves_the_move_owed_for_another(redis_client):
    """Two runs of one max wait queued in another order than their deadlines (two workers
    parking at once): the poll finds the first due and owes a move for it; the move
    brings the second, due by then too and given up; the first is owed a move again at
    the next poll, not once the first move has been in flight 0.5 s."""
    limiters = [limit("crossed-wait")]
    key = limiters[0].key
    assert isinstance(ask(redis_client, limiters, "h"), Lease)
    first = ask(redis_client, limiters, "first", max_wait=0.5)
    time.sleep(0.4)
    second = ask(redis_client, limiters, "second", max_wait=0.5)
    time.sleep(0.12)  # the first due, the second in about 0.38 s
    assert due(redis_client, {key: 2}) == [DeadlineMove(key)]
    time.sleep(0.4)  # the second due too; the move's hold lapses 0.1 s from now
    assert isinstance(ask(redis_client, limiters, "second", parked=second.park, max_wait=0.5),
                      GaveUp)
    assert due(redis_client, {key: 1}) == [DeadlineMove(key)]
    assert due(redis_client, {key: 1}) == []
    assert isinstance(ask(redis_client, limiters, "first", parked=first.park, max_wait=0.5),
                      GaveUp)
    assert deadlines(redis_client, key) == []


def test_a_claimed_run_leaves_the_deadlines(redis_client):
    limiters = [limit("claimed-wait")]
    key = limiters[0].key
    holder = ask(redis_client, limiters, "h")
    parked = ask(redis_client, limiters, "w", max_wait=30)
    assert len(deadlines(redis_client, key)) == 1
    holder.release()
    lease = ask(redis_client, limiters, "w", parked=parked.park, max_wait=30)
    assert isinstance(lease, Lease)
    assert deadlines(redis_client, key) == []


def heavy(name: str, slots: int = 3, cost: int = 2) -> SlotLimit:
    return SlotLimit(name, slots, PREFIX, cost=cost)


def units(client: Any, key: str) -> int:
    return int(client.zcount(key, f"({int(time.time() * 1000)}", "+inf"))


def test_weighted_runs_park_and_the_heavy_head_keeps_units_free(redis_client):
    """3 units: a run of cost 2 holds, a second parks; a light run (cost 1) parks behind
    it although one unit is free (nobody overtakes); the holder's release reserves 2
    units for the heavy head and 1 for the light run; never over 3."""
    two, one = [heavy("weighted")], [heavy("weighted", cost=1)]
    key = two[0].key
    first = ask(redis_client, two, "h0")
    assert isinstance(first, Lease) and units(redis_client, key) == 2
    second = ask(redis_client, two, "h1")
    assert isinstance(second, Busy) and second.park
    light = ask(redis_client, one, "l0")
    assert isinstance(light, Busy) and light.park  # one unit free, but the line waits
    assert units(redis_client, key) == 2
    assert first.release()
    # 3 units free: 2 reserved for the heavy head, 1 for the light run behind it.
    assert len(first.handoffs) == 2
    assert units(redis_client, key) == 3
    moved = ask(redis_client, two, "h1", parked=second.park)
    assert isinstance(moved, Lease) and units(redis_client, key) == 3
    assert isinstance(ask(redis_client, one, "l0", parked=light.park), Lease)
    assert units(redis_client, key) == 3
    assert moved.release()
    assert units(redis_client, key) == 1


def test_a_heavy_head_waits_for_enough_units(redis_client):
    """Three light holders of 3 units; a heavy run parks, then a light one behind it: a
    release frees 1 unit, not enough for the head: nothing is reserved, nobody moves; a
    second release frees 2: the head's reservation (2 units), one move."""
    two, one = [heavy("head-waits")], [heavy("head-waits", cost=1)]
    key = two[0].key
    holders = [ask(redis_client, one, f"l{i}") for i in range(3)]
    assert all(isinstance(h, Lease) for h in holders)
    big = ask(redis_client, two, "big")
    small = ask(redis_client, one, "small")
    assert big.park and small.park
    holders[0].release()
    assert holders[0].handoffs == []
    assert isinstance(ask(redis_client, one, "late"), Busy)  # the free unit is kept
    holders[1].release()
    assert len(holders[1].handoffs) == 1
    assert isinstance(ask(redis_client, two, "big", parked=big.park), Lease)
    assert units(redis_client, key) == 3
    holders[2].release()  # one unit: the light run's turn
    assert len(holders[2].handoffs) == 1
    assert isinstance(ask(redis_client, one, "small", parked=small.park), Lease)
    assert units(redis_client, key) == 3


def test_a_copy_not_due_leaves_the_move_owed_for_its_own_sub_line(redis_client):
    """A fair line: runs due in two sub-lines are owed a deadline move each; the move in
    sub-line "a" brings a run not due (a longer max wait, parked first): the run due in
    "a" is owed a move again at once, not the one in "b", whose own move is in flight."""
    def in_sub(sub: str) -> List[SlotLimit]:
        return [SlotLimit("fair-wait", 1, PREFIX, 1, sub)]

    key = in_sub("")[0].key
    assert isinstance(ask(redis_client, in_sub("a"), "h"), Lease)
    long = ask(redis_client, in_sub("a"), "long", max_wait=60)
    due_a = ask(redis_client, in_sub("a"), "za", max_wait=0.2)  # sorts after "b"'s run
    due_b = ask(redis_client, in_sub("b"), "b", max_wait=0.2)
    time.sleep(0.25)
    assert sorted(move.sub for move in due(redis_client, {key: 3})) == ["a", "b"]
    again = ask(redis_client, in_sub("a"), "long", parked=long.park, max_wait=60)
    assert isinstance(again, Busy)
    assert due(redis_client, {key: 3}) == [DeadlineMove(key, "a")]
    for task, sub, parked in (("za", "a", due_a), ("b", "b", due_b)):
        assert isinstance(ask(redis_client, in_sub(sub), task, parked=parked.park,
                              max_wait=0.2), GaveUp)
