"""The lock store's side of a rate limit's parked line (engine/parking_rate.py), on a
real redis-server: a run whose start is far parks with a promise in the rate key's FIFO,
the poll moves the heads due, the moved copy takes its start; one start per interval."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import pytest

from celery_redislock.admin import control
from celery_redislock.engine.admission import (
    Booked,
    Busy,
    Lease,
    ParkRef,
    RateLimit,
    Served,
    SlotLimit,
    declare_fresh,
)
from celery_redislock.engine.parking import DeadlineMove, GaveUp, leave, park_admit, run_id
from celery_redislock.engine.parking_rate import (
    LEAD_MS,
    due_rate,
    rate_index,
    rate_park_admit,
    rate_parked_keys,
)
from celery_redislock.engine.rate import Rate

PREFIX = "redislock:"


def limit(name: str = "rated", rate: str = "5/s", burst: int = 0) -> RateLimit:
    return RateLimit(name, Rate.parse(rate, burst=burst), PREFIX)


def server_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_far_start_parks_near_start_is_booked(redis_client: Any) -> None:
    rate = [limit()]
    first = rate_park_admit(redis_client, rate, lease=5, run=run_id("a", 0), book_ms=500)
    assert isinstance(first, Lease)
    booked = [rate_park_admit(redis_client, rate, lease=5, run=run_id(f"b{i}", 0),
                              book_ms=500) for i in range(2)]
    assert all(isinstance(outcome, Booked) for outcome in booked)
    assert 0.15 <= booked[0].wait <= 0.2 and 0.35 <= booked[1].wait <= 0.4
    parked = rate_park_admit(redis_client, rate, lease=5, run=run_id("c", 0), book_ms=500)
    assert isinstance(parked, Busy) and parked.park is not None
    assert parked.park.key == rate[0].key and 0.55 <= parked.retry_hint <= 0.6
    assert rate_parked_keys(redis_client, PREFIX) == [rate[0].key]
    assert redis_client.llen(rate[0].key + ":pq") == 1
    # Without booking (the caller does not hold runs) a near start parks too.
    other = rate_park_admit(redis_client, rate, lease=5, run=run_id("d", 0))
    assert isinstance(other, Busy) and other.park is not None


def test_poll_moves_heads_due_and_moved_copy_takes_its_start(redis_client: Any) -> None:
    rate = [limit()]
    key = rate[0].key
    parks: Dict[str, Any] = {}
    assert isinstance(rate_park_admit(redis_client, rate, lease=5, run="r0:0"), Lease)
    for i in range(1, 6):  # starts promised 0.2 .. 1.0 s from now, all parked
        outcome = rate_park_admit(redis_client, rate, lease=5, run=f"r{i}:0")
        assert isinstance(outcome, Busy) and outcome.park is not None
        parks[f"r{i}:0"] = outcome.park
    moved: List[str] = []
    starts = []
    deadline = time.monotonic() + 5
    while len(moved) < 5 and time.monotonic() < deadline:
        for move in due_rate(redis_client, {key: 5 - len(moved)}, prefix=PREFIX):
            assert move.key == key
            run = f"r{len(moved) + 1}:0"
            moved.append(run)
            # the moved copy asks at once (as a worker does when it arrives)
            outcome = rate_park_admit(redis_client, rate, lease=5, run=run,
                                      parked=parks[run], book_ms=500)
            assert isinstance(outcome, (Lease, Booked)), outcome
            starts.append(outcome.lease.acquired_at_ms if isinstance(outcome, Booked)
                          else outcome.acquired_at_ms)
            if isinstance(outcome, Lease):  # the same copy again (a redelivery): stale
                assert isinstance(rate_park_admit(redis_client, rate, lease=5, run=run,
                                                  parked=parks[run]), Served)
        time.sleep(0.05)
    assert len(moved) == 5
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(gap >= 199 for gap in gaps), gaps
    assert due_rate(redis_client, {key: 0}, prefix=PREFIX) == []
    assert rate_parked_keys(redis_client, PREFIX) == []


def test_poll_moves_only_what_is_due(redis_client: Any) -> None:
    rate = [limit(rate="1/s")]
    key = rate[0].key
    rate_park_admit(redis_client, rate, lease=5, run="x0:0")
    for i in range(1, 4):
        rate_park_admit(redis_client, rate, lease=5, run=f"x{i}:0")
    assert due_rate(redis_client, {key: 3}, prefix=PREFIX) == []  # first due in 1 s
    time.sleep((1000 - LEAD_MS + 50) / 1000)
    assert len(due_rate(redis_client, {key: 3}, prefix=PREFIX)) == 1
    assert due_rate(redis_client, {key: 2}, prefix=PREFIX) == []


def test_stale_and_original_copies(redis_client: Any) -> None:
    rate = [limit(rate="1/s")]
    rate_park_admit(redis_client, rate, lease=5, run="s0:0")
    first = rate_park_admit(redis_client, rate, lease=5, run="s1:0")
    assert isinstance(first, Busy) and first.park is not None
    # the original delivered again (its worker died after publishing the copy): parks
    # again under a new park id; the first copy is then stale
    again = rate_park_admit(redis_client, rate, lease=5, run="s1:0")
    assert isinstance(again, Busy) and again.park is not None
    assert again.park.park_id != first.park.park_id
    assert isinstance(rate_park_admit(redis_client, rate, lease=5, run="s1:0",
                                      parked=first.park), Served)


def test_queue_unknown_to_the_store_gets_promises(redis_client: Any) -> None:
    """After a loss of the store's data, a parking queue's messages get starts."""
    rate = [limit(rate="10/s")]
    key = rate[0].key
    assert due_rate(redis_client, {key: 3}, prefix=PREFIX) == []
    time.sleep(2.1)
    owed: List[Any] = []
    deadline = time.monotonic() + 3
    while len(owed) < 3 and time.monotonic() < deadline:
        owed += due_rate(redis_client, {key: 3 - len(owed)}, prefix=PREFIX)
        time.sleep(0.05)
    assert len(owed) == 3
    # the moved copies the store does not know ask as newcomers
    outcome = rate_park_admit(redis_client, rate, lease=5, run="lost:0",
                              parked=ParkRef(key, "r:99"), book_ms=500)
    assert isinstance(outcome, (Lease, Booked, Busy))
    assert redis_client.exists(rate_index(PREFIX))


@pytest.mark.parametrize("waiting", [1000, 20000])
def test_cost_does_not_grow_with_the_line(own_redis_server: Any, waiting: int) -> None:
    """Parks and polls read O(1) entries: their commands per call do not depend on the
    number of runs parked (counted with INFO commandstats)."""
    # A server of its own: INFO commandstats counts every client's commands, and on the
    # shared server another client (a thread an earlier test left behind) adds to them.
    redis_client = own_redis_server.client()
    declare_fresh(redis_client)  # emptied on purpose: not a store that lost its data
    rate = [limit(rate="1/s")]
    key = rate[0].key
    pipe = redis_client.pipeline(transaction=False)
    pipe.hset(key, mapping={"tat": server_us(redis_client) + 10**6,
                            "line": server_us(redis_client) + waiting * 10**6})
    for start in range(0, waiting, 5000):
        end = min(waiting, start + 5000)
        pipe.rpush(key + ":pq", *(str(10**18 + i) for i in range(start, end)))
    pipe.execute()
    rate_park_admit(redis_client, rate, lease=5, run="warm:0")  # scripts loaded
    due_rate(redis_client, {key: waiting}, prefix=PREFIX)
    redis_client.config_resetstat()
    for i in range(200):
        assert isinstance(rate_park_admit(redis_client, rate, lease=5, run=f"n{i}:0"), Busy)
        due_rate(redis_client, {key: waiting + i}, prefix=PREFIX)
    stats = redis_client.info("commandstats")
    scripts = [v for k, v in stats.items() if k.startswith("cmdstat_ev")]
    assert sum(v["calls"] for v in scripts) == 400  # one script each, no other command
    usec = sum(v["usec"] for v in scripts) / 400
    assert usec < 1000, usec  # the server's µs per call, at any length (printed by -s)
    print(f"{waiting} parked: {usec:.0f} µs per call on the server")


def test_a_booked_copy_that_asks_again_keeps_its_turn(redis_client: Any) -> None:
    """A moved copy booked a start, then could not start on time (no pool process free):
    it gives the start back and asks again; it is not taken for a stale copy."""
    rate = [limit(rate="2/s")]
    key = rate[0].key
    rate_park_admit(redis_client, rate, lease=5, run="h0:0")
    parked = rate_park_admit(redis_client, rate, lease=5, run="h1:0")
    assert isinstance(parked, Busy) and parked.park is not None
    wait = 0.0
    while not due_rate(redis_client, {key: 1}, prefix=PREFIX):
        time.sleep(0.02)
        wait += 0.02
        assert wait < 2
    booked = rate_park_admit(redis_client, rate, lease=5, run="h1:0", parked=parked.park,
                             book_ms=500)
    assert isinstance(booked, Booked), booked
    assert booked.give_back()
    again = rate_park_admit(redis_client, rate, lease=5, run="h1:0", parked=parked.park,
                            book_ms=500)
    assert isinstance(again, (Booked, Lease)), again


def test_a_paused_rate_parks_runs_and_promises_them_starts_once_it_ends(
        redis_client: Any) -> None:
    """Paused, a run parks (one message) with no promise; the poll moves nothing while the
    pause lasts, then promises them the next starts (one per interval)."""
    rate = [limit(rate="10/s")]
    key = rate[0].key
    control = key.replace("}:r:", "}:cr:")
    redis_client.hset(control, "paused_until", "forever")
    parked = [rate_park_admit(redis_client, rate, lease=5, run=f"p{i}:0", book_ms=500)
              for i in range(3)]
    assert all(isinstance(outcome, Busy) and outcome.park is not None for outcome in parked)
    assert rate_parked_keys(redis_client, PREFIX) == [key]
    for _ in range(3):
        assert due_rate(redis_client, {key: 3}, prefix=PREFIX) == []
    redis_client.hdel(control, "paused_until")
    owed = due_rate(redis_client, {key: 3}, prefix=PREFIX)
    assert 1 <= len(owed) <= 3  # those due within the lead: 100 ms apart
    for i, outcome in enumerate(parked[:len(owed)]):
        assert outcome.park is not None
        moved = rate_park_admit(redis_client, rate, lease=5, run=f"p{i}:0",
                                parked=outcome.park, book_ms=500)
        assert isinstance(moved, (Lease, Booked)), moved


def test_a_max_wait_gives_up_the_head_and_its_start_goes_back(redis_client: Any) -> None:
    """1/s: r0 admitted, r1..r3 parked with a max wait of 0.3 s (starts promised 1, 2 and
    3 s away). The poll owes one deadline move per run due (the head of the parking
    queue); each copy it brings is given up (status 5) and gives back the line's last
    start: afterwards the line is empty and a newcomer is promised the first start after
    r0's, not one behind the given-up runs."""
    rate = [limit(rate="1/s")]
    key = rate[0].key
    assert isinstance(rate_park_admit(redis_client, rate, lease=5, run="d0:0",
                                      max_wait=0.3), Lease)
    parks = [rate_park_admit(redis_client, rate, lease=5, run=f"d{i}:0", max_wait=0.3).park
             for i in range(1, 4)]
    assert all(park is not None for park in parks)
    assert due_rate(redis_client, {key: 3}, prefix=PREFIX) == []  # nobody due yet
    time.sleep(0.35)
    moves = due_rate(redis_client, {key: 3}, prefix=PREFIX)
    assert moves == [DeadlineMove(key)] * 3
    assert due_rate(redis_client, {key: 0}, prefix=PREFIX) == []  # in flight: owed once
    for i, park in enumerate(parks, start=1):  # the heads, in the order they parked
        outcome = rate_park_admit(redis_client, rate, lease=5, run=f"d{i}:0", parked=park,
                                  max_wait=0.3)
        assert isinstance(outcome, GaveUp) and outcome.key == key, outcome
        assert 0.3 <= outcome.waited < 1.0
        # served: another copy of the run (the broker's redelivery) ends unrun
        assert isinstance(rate_park_admit(redis_client, rate, lease=5, run=f"d{i}:0",
                                          parked=park, max_wait=0.3), Served)
    assert redis_client.llen(key + ":pq") == 0
    newcomer = rate_park_admit(redis_client, rate, lease=5, run="e:0", max_wait=5)
    assert isinstance(newcomer, Busy) and newcomer.retry_hint <= 0.7, newcomer


def test_a_deadline_move_that_brings_a_run_not_due_parks_it_again(redis_client: Any) -> None:
    """Mixed max waits on one key: the head (no max wait) is brought for the run behind it
    (0.2 s): it parks again with its promise kept, and the run due is owed a deadline move
    again at the next poll (not once the first has been in flight 0.5 s), given up."""
    rate = [limit(rate="1/10s")]
    key = rate[0].key
    rate_park_admit(redis_client, rate, lease=5, run="m0:0")
    head = rate_park_admit(redis_client, rate, lease=5, run="m1:0").park
    due = rate_park_admit(redis_client, rate, lease=5, run="m2:0", max_wait=0.2).park
    time.sleep(0.25)
    assert due_rate(redis_client, {key: 2}, prefix=PREFIX) == [DeadlineMove(key)]
    again = rate_park_admit(redis_client, rate, lease=5, run="m1:0", parked=head)
    assert isinstance(again, Busy) and again.park is not None and again.park != head
    assert redis_client.llen(key + ":pq") == 2  # both promises kept
    assert due_rate(redis_client, {key: 2}, prefix=PREFIX) == [DeadlineMove(key)]
    assert due_rate(redis_client, {key: 2}, prefix=PREFIX) == []  # in flight: owed once
    gave_up = rate_park_admit(redis_client, rate, lease=5, run="m2:0", parked=due,
                              max_wait=0.2)
    assert isinstance(gave_up, GaveUp)
    assert redis_client.llen(key + ":pq") == 1


def test_a_run_that_leaves_drops_its_deadline_and_gives_its_start_back(
        redis_client: Any) -> None:
    """A run parked with a max wait is moved by a deadline move but revoked: it leaves
    (its reference and deadline dropped, its start back to the line): no deadline move
    is owed for it again."""
    rate = [limit(rate="1/10s")]
    key = rate[0].key
    rate_park_admit(redis_client, rate, lease=5, run="v0:0")
    park = rate_park_admit(redis_client, rate, lease=5, run="v1:0", max_wait=0.2).park
    time.sleep(0.25)
    assert due_rate(redis_client, {key: 1}, prefix=PREFIX) == [DeadlineMove(key)]
    assert leave(redis_client, park, "v1:0", moved=True) == []
    assert redis_client.hget(key + ":pr", "v1:0") is None
    assert redis_client.llen(key + ":pq") == 0
    time.sleep(0.55)  # a deadline move in flight would be owed again by now
    assert due_rate(redis_client, {key: 0}, prefix=PREFIX) == []


def test_acks_late_the_copy_that_ran_runs_again_another_copy_does_not(
        redis_client: Any) -> None:
    """Acks late: an admission serves the run's rate reference with the id of the copy
    admitted. That very copy, given back by the broker (its worker died before the
    acknowledgement), asks again as a newcomer; another copy (another id, or none:
    default acks) ends unrun."""
    rate = [limit("late-ack", rate="10/s")]
    assert isinstance(rate_park_admit(redis_client, rate, lease=5, run="l0:0"), Lease)
    parked = rate_park_admit(redis_client, rate, lease=5, run="l1:0")
    assert isinstance(parked, Busy) and parked.park is not None
    time.sleep(0.25)  # its promised start is past

    def ask(copy: str, park: Any = parked.park) -> Any:
        return rate_park_admit(redis_client, rate, lease=5, run="l1:0", parked=park,
                               copy=copy)

    assert isinstance(ask("c1"), Lease)
    assert isinstance(ask("c2"), Served) and isinstance(ask(""), Served)
    time.sleep(0.25)  # room at the rate again
    assert isinstance(ask("c1"), Lease)  # the copy that ran, given back: runs again
    assert isinstance(ask("c2"), Served)
    again = ask("c1")  # at once: no room at the rate, it parks (a new park id)
    assert isinstance(again, Busy) and again.park is not None
    assert again.park.park_id != parked.park.park_id
    time.sleep(0.25)
    assert isinstance(ask("c9", again.park), Lease)  # moved out of parking: its turn
    assert isinstance(ask("c1"), Served)


def test_acks_late_a_copy_run_again_parks_at_a_semaphore_and_runs_once_moved(
        redis_client: Any) -> None:
    """A semaphore and a rate: the copy that ran, given back while the semaphore is full,
    parks there; its rate reference served to it is dropped, so that the copy moved out
    of the semaphore's parking queue (another id) runs, and is not taken for stale."""
    sem = SlotLimit("late-mixed", 2, PREFIX)
    both = [sem, limit("late-mixed", rate="10/s")]
    first = park_admit(redis_client, both, lease=30, run="m0:0")
    assert isinstance(first, Lease)
    parked = park_admit(redis_client, both, lease=30, run="m1:0")  # the rate: no room
    assert isinstance(parked, Busy) and parked.park is not None
    assert parked.park.key == both[1].key
    assert first.release()
    time.sleep(0.25)
    ran = park_admit(redis_client, both, lease=30, run="m1:0", parked=parked.park, copy="c1")
    assert isinstance(ran, Lease) and ran.release()
    holders = [park_admit(redis_client, [sem], lease=30, run=f"h{i}:0") for i in range(2)]
    assert all(isinstance(holder, Lease) for holder in holders)
    time.sleep(0.25)
    again = park_admit(redis_client, both, lease=30, run="m1:0", parked=parked.park, copy="c1")
    assert isinstance(again, Busy) and again.park is not None and again.park.key == sem.key
    assert holders[0].release()
    moved = park_admit(redis_client, both, lease=30, run="m1:0", parked=again.park, copy="c9")
    assert isinstance(moved, Lease)
    assert isinstance(park_admit(redis_client, both, lease=30, run="m1:0",
                                 parked=parked.park, copy="c1"), Busy)  # claimed: parks
    assert moved.release() and holders[1].release()
    assert isinstance(park_admit(redis_client, both, lease=30, run="m1:0",
                                 parked=again.park, copy="c1"), Served)


def _park_runs(client: Any, rate: List[RateLimit], count: int) -> Dict[str, Any]:
    """One run admitted, then ``count`` runs parked with promised starts, by run."""
    assert isinstance(rate_park_admit(client, rate, lease=5, run="p0:0"), Lease)
    parks = {}
    for i in range(1, count + 1):
        outcome = rate_park_admit(client, rate, lease=5, run=f"p{i}:0")
        assert isinstance(outcome, Busy) and outcome.park is not None
        parks[f"p{i}:0"] = outcome.park
    return parks


def test_a_raised_rate_moves_the_parked_runs_earlier(redis_client: Any) -> None:
    """2/s: ten runs parked with starts 0.5 s apart (the last 5 s away). Raised to 20/s
    (set-rate), the poll owes most of them at once: their starts were re-planned to
    0.05 s apart (before, the poll moved them at the old pace whatever the rate)."""
    rate = [limit("raised", rate="2/s")]
    _park_runs(redis_client, rate, 10)
    control.set_rate(redis_client, "raised", "20/s")
    moves = due_rate(redis_client, {rate[0].key: 10}, prefix=PREFIX)
    assert len(moves) >= 6, moves
    newcomer = rate_park_admit(redis_client, rate, lease=5, run="late:0")
    assert isinstance(newcomer, Busy) and newcomer.retry_hint < 1.0  # behind the new line
    control.clear_rate(redis_client, "raised")


def test_a_lowered_rate_moves_the_parked_runs_later_in_order(redis_client: Any) -> None:
    """20/s: five runs parked with starts 50 ms apart. Lowered to 2/s, the poll moves them
    in their order at the new pace, each moved copy is admitted, and no two starts are
    closer than the new interval (before, all five were moved at once and every copy
    but one parked again, behind newcomers)."""
    rate = [limit("lowered", rate="20/s")]
    key = rate[0].key
    parks = _park_runs(redis_client, rate, 5)
    control.set_rate(redis_client, "lowered", "2/s")
    order, starts = [], []
    deadline = time.monotonic() + 10
    while len(order) < 5:
        assert time.monotonic() < deadline, f"moved {order}"
        for _ in due_rate(redis_client, {key: 5 - len(order)}, prefix=PREFIX):
            run = f"p{len(order) + 1}:0"
            outcome = rate_park_admit(redis_client, rate, lease=5, run=run, parked=parks[run],
                                      book_ms=500)  # moved up to the poll's lead early
            assert isinstance(outcome, (Lease, Booked)), (run, outcome)
            order.append(run)
            starts.append(outcome.lease.acquired_at_ms if isinstance(outcome, Booked)
                          else outcome.acquired_at_ms)
        time.sleep(0.02)
    assert [b - a for a, b in zip(starts, starts[1:])] == pytest.approx([500] * 4, abs=60)
    control.clear_rate(redis_client, "lowered")


def test_an_unchanged_rate_is_never_re_planned(redis_client: Any) -> None:
    """3/s (an interval of a fraction of a µs more than 333,333): its line is planned in
    whole µs, and asking or polling does not take that rounding for a change of rate."""
    rate = [limit("thirds", rate="3/s")]
    parks = _park_runs(redis_client, rate, 3)
    due_rate(redis_client, {rate[0].key: 3}, prefix=PREFIX)
    rate_park_admit(redis_client, rate, lease=5, run="p1:0", parked=parks["p1:0"])
    assert redis_client.hget(rate[0].key + ":pn", "pm") is None


def test_a_raised_rate_re_plans_a_line_of_runs_with_slots_too(redis_client: Any) -> None:
    """A semaphore and a rate (2/s): six runs parked at the rate's line. Raised to 20/s,
    the next admission re-plans the line (before any poll): a newcomer is promised a
    start within a second, and the poll then owes most of the parked runs at once."""
    both = [SlotLimit("mix-plan", 5, PREFIX), limit("mix-plan", rate="2/s")]
    assert isinstance(park_admit(redis_client, both, lease=30, run="q0:0"), Lease)
    for i in range(1, 7):
        parked = park_admit(redis_client, both, lease=30, run=f"q{i}:0")
        assert isinstance(parked, Busy) and parked.park is not None
        assert parked.park.key == both[1].key
    control.set_rate(redis_client, "mix-plan", "20/s")
    newcomer = park_admit(redis_client, both, lease=30, run="q7:0")
    assert isinstance(newcomer, Busy) and newcomer.retry_hint < 1.0
    assert len(due_rate(redis_client, {both[1].key: 7}, prefix=PREFIX)) >= 5
    control.clear_rate(redis_client, "mix-plan")
