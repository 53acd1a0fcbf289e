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
    # The next poll moves the next head: the run due, given up.
    assert due(redis_client, {key: 2}) == [DeadlineMove(key)]
    assert isinstance(ask(redis_client, limiters, "short", parked=short.park, max_wait=0.2),
                      GaveUp)


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
