"""Rate limits and waiting lines, on a real Redis server.

A run under a slot limit and a rate limit waits in the semaphore's line like any run;
the start a rate limiter promises it is kept in the line, so both copies of its message
(the express one re-published at hand-off and the one sent back with a countdown) use
one start. A rate whose interval changes at run time re-plans the starts it promised.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

import pytest

from celery_redislock.admin import control
from celery_redislock.engine.admission import (
    Busy,
    Lease,
    RateLimit,
    RateLimited,
    Served,
    SlotLimit,
    Ticket,
    admit,
)
from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.engine.rate import Rate
from celery_redislock.integration.handoff import reservation_ms

from old_line import join_line

PREFIX = "redislock:"
KEEP_MS = 60_000
RESERVE_MS = reservation_ms(30)


def server_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def wait_for_server_time(client: Any, us: int, deadline: float = 10.0) -> None:
    """Poll the server's clock until it reaches ``us`` (no sleep as synchronisation)."""
    give_up = time.monotonic() + deadline
    while server_us(client) < us:
        assert time.monotonic() < give_up, "the server's clock did not move"
        time.sleep(0.005)


class Run:
    """One task run under a slot limit and a rate limit, asking as its copies would."""

    def __init__(self, client: Any, limiters: list, task_id: str) -> None:
        self.client = client
        self.limiters = limiters
        self.ticket_id = f"{task_id}.0001"

    def ask(self, copy: str, *, express: bool = False, ticket: bool = True,
            promise: Optional[int] = None) -> Any:
        rate = self.limiters[1]
        promises: Dict[str, int] = {rate.key: promise} if promise else {}
        return admit(self.client, self.limiters, lease=30, promises=promises,
                     ticket=Ticket(self.ticket_id if ticket else "", express, KEEP_MS, copy),
                     reserve_ms=RESERVE_MS)

    def join(self, since_ms: int) -> list:
        _, handed = join_line(self.client, self.limiters[0].key, self.ticket_id, since_ms,
                              "{}", f"message of {self.ticket_id}", keep_ms=KEEP_MS,
                              reserve_ms=RESERVE_MS)
        return handed


def line_hash(semaphore: SlotLimit) -> str:
    return companion_key(semaphore.key, "w")


def test_both_copies_of_a_waiting_run_share_one_promised_start(redis_client) -> None:
    """One slot and 2/s (no burst). A run waits in line; the slot is handed to it, and
    its express copy is promised the next start. Its countdown copy, asking meanwhile,
    is told the same start (and that the other copy holds it): the line of promised
    starts moves once. The slot stays reserved for the run until after its start;
    whichever copy asks first at the start runs, the other finds the run served."""
    slot = SlotLimit("acct", 1, PREFIX)
    rate = RateLimit("api", Rate.parse("2/s", burst=0), PREFIX)
    holder = admit(redis_client, [slot, rate], lease=30)
    assert isinstance(holder, Lease)
    run = Run(redis_client, [slot, rate], "t1")
    refused = run.ask("o:c1", ticket=False)
    assert isinstance(refused, Busy) and refused.position is None
    run.join(refused.server_time_ms)

    holder._reserve_ms = RESERVE_MS
    holder.release()
    assert len(holder.handoffs) == 1  # the slot is reserved for the run
    express = run.ask("e:c2", express=True)
    assert isinstance(express, RateLimited) and not express.other_copy
    assert express.ahead == 0
    line_end = int(redis_client.hget(rate.key, "line"))
    kept = json.loads(redis_client.hget(line_hash(slot), f"p:{run.ticket_id}"))
    assert int(kept[rate.key]) == express.promise
    reserved = redis_client.zscore(slot.key, f"~{run.ticket_id}")
    assert reserved >= express.promise / 1000 + RESERVE_MS - 1

    countdown = run.ask("o:c1")
    assert isinstance(countdown, RateLimited)
    assert countdown.promise == express.promise and countdown.other_copy
    assert int(redis_client.hget(rate.key, "line")) == line_end  # no second start

    newcomer = admit(redis_client, [slot, rate], lease=30)
    assert isinstance(newcomer, Busy)  # the slot is the run's, however long it waits

    wait_for_server_time(redis_client, express.promise)
    admitted = run.ask("o:c3", promise=express.promise)  # the express copy, sent back
    assert isinstance(admitted, Lease)
    assert isinstance(run.ask("o:c1"), Served)
    assert not redis_client.hexists(line_hash(slot), f"p:{run.ticket_id}")
    admitted.release()


def test_the_copy_that_comes_first_at_the_start_runs(redis_client) -> None:
    """The countdown copy, told the start another copy holds, may itself come back at
    or after it: it runs (the start is the ticket's, not the copy's), and the express
    copy then finds the run served. One start, one run."""
    slot = SlotLimit("acct2", 1, PREFIX)
    rate = RateLimit("api2", Rate.parse("2/s", burst=0), PREFIX)
    holder = admit(redis_client, [slot, rate], lease=30)
    run = Run(redis_client, [slot, rate], "t2")
    run.join(run.ask("o:c1", ticket=False).server_time_ms)
    holder._reserve_ms = RESERVE_MS
    holder.release()
    express = run.ask("e:c2", express=True)
    assert isinstance(express, RateLimited)
    wait_for_server_time(redis_client, express.promise)
    assert isinstance(run.ask("o:c1"), Lease)
    state = redis_client.hgetall(rate.key)
    assert isinstance(run.ask("o:c3", promise=express.promise), Served)
    assert redis_client.hgetall(rate.key) == state  # no second start


def test_the_fallback_copy_never_takes_a_start_early(redis_client) -> None:
    """1/s, burst 1. A newcomer is promised +1 s and never comes; the waiting run's
    express copy is promised +2 s. At +1.6 s the start left free could go to a run
    that comes early: the countdown copy, which only stands in for the express one, is
    refused (it would leave the express copy's start unused, a start lost); the copy
    that holds the promise takes it."""
    slot = SlotLimit("acct4", 1, PREFIX)
    rate = RateLimit("api4", Rate.parse("1/s", burst=1), PREFIX)
    holder = admit(redis_client, [slot, rate], lease=30)
    assert isinstance(admit(redis_client, [rate], lease=30), Lease)  # the burst
    newcomer = admit(redis_client, [rate], lease=30)
    assert isinstance(newcomer, RateLimited)
    run = Run(redis_client, [slot, rate], "t4")
    run.join(run.ask("o:c1", ticket=False).server_time_ms)
    holder._reserve_ms = RESERVE_MS
    holder.release()
    express = run.ask("e:c2", express=True)
    assert isinstance(express, RateLimited)
    assert express.promise - newcomer.promise == 1_000_000
    wait_for_server_time(redis_client, express.promise - 400_000)
    fallback = run.ask("o:c1")
    assert isinstance(fallback, RateLimited) and fallback.other_copy
    assert isinstance(run.ask("o:c3", promise=express.promise), Lease)
    assert isinstance(run.ask("o:c1"), Served)


def test_a_run_at_the_front_of_the_line_keeps_its_slot_while_it_waits_for_its_start(
        redis_client) -> None:
    """Two slots and 1/s (no burst): the rate, not the slots, holds the line back. The
    first waiter, reaching a free slot at the front of the line, is promised a start
    and keeps that slot reserved; a newcomer does not take the slot meanwhile."""
    slot = SlotLimit("acct3", 2, PREFIX)
    rate = RateLimit("api3", Rate.parse("1/s", burst=0), PREFIX)
    first = admit(redis_client, [slot, rate], lease=30)
    other = admit(redis_client, [SlotLimit("acct3", 2, PREFIX)], lease=30)  # the 2nd slot
    assert isinstance(first, Lease) and isinstance(other, Lease)
    run = Run(redis_client, [slot, rate], "t3")
    run.join(run.ask("o:c1", ticket=False).server_time_ms)
    other.release()  # a slot is free; reserve 0: not handed over, the run finds it
    refused = run.ask("o:c1")
    assert isinstance(refused, RateLimited)
    assert redis_client.zscore(slot.key, f"~{run.ticket_id}") is not None
    assert isinstance(admit(redis_client, [slot], lease=30), Busy)
    first.release()


def test_a_run_asking_long_before_its_start_takes_no_start_from_runs_due_before(
        redis_client) -> None:
    """1/s, no burst: two runs promised +1 s and +2 s. The first never comes back; at
    +1.2 s the second asks (0.8 s early): the start is free, but it keeps its promise
    (it asks again, to hear of a raised rate, not to overtake); within half a second of
    its start it takes a start left free."""
    rate = RateLimit("early", Rate.parse("1/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    first = admit(redis_client, [rate], lease=1)
    second = admit(redis_client, [rate], lease=1)
    assert isinstance(first, RateLimited) and isinstance(second, RateLimited)
    wait_for_server_time(redis_client, first.promise + 200_000)
    before = server_us(redis_client)
    early = admit(redis_client, [rate], lease=1, promises={rate.key: second.promise})
    if before < second.promise - 500_000:
        assert isinstance(early, RateLimited) and early.promise == second.promise
    wait_for_server_time(redis_client, second.promise - 400_000)
    assert isinstance(admit(redis_client, [rate], lease=1,
                            promises={rate.key: second.promise}), Lease)


def test_raised_rate_moves_promised_starts_earlier(redis_client) -> None:
    """2/s, no burst: ten runs promised starts 0.5 s apart. Raised to 20/s, a run that
    was promised a start 5 s away is promised one about 0.5 s away (or admitted); a
    newcomer goes behind the re-planned line, not behind the old one."""
    rate = RateLimit("raise", Rate.parse("2/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    promised = [admit(redis_client, [rate], lease=1) for _ in range(10)]
    assert all(isinstance(one, RateLimited) for one in promised)
    old_end = int(redis_client.hget(rate.key, "line"))
    control.set_rate(redis_client, "raise", "20/s")
    changed = server_us(redis_client)
    last = admit(redis_client, [rate], lease=1, promises={rate.key: promised[-1].promise})
    assert isinstance(last, RateLimited)
    assert last.promise - changed < 0.1 * (promised[-1].promise - changed) + 100_000
    newcomer = admit(redis_client, [rate], lease=1)
    assert isinstance(newcomer, RateLimited)
    assert newcomer.promise < changed + 1_000_000 < old_end
    assert redis_client.hget(rate.key, "rp") is not None
    control.clear_rate(redis_client, "raise")


def test_lowered_rate_moves_promised_starts_later(redis_client) -> None:
    """20/s, no burst: ten runs promised starts 50 ms apart. Lowered to 2/s, the run
    promised the fifth start is promised one about 2.5 s away, and runs promised before
    the change keep their order at the new pace."""
    rate = RateLimit("lower", Rate.parse("20/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    promised = [admit(redis_client, [rate], lease=1) for _ in range(10)]
    assert all(isinstance(one, RateLimited) for one in promised)
    control.set_rate(redis_client, "lower", "2/s")
    fifth = admit(redis_client, [rate], lease=1, promises={rate.key: promised[4].promise})
    ninth = admit(redis_client, [rate], lease=1, promises={rate.key: promised[8].promise})
    assert isinstance(fifth, RateLimited) and isinstance(ninth, RateLimited)
    changed = int(redis_client.hget(rate.key, "rp").split()[0])
    assert fifth.promise - changed == pytest.approx(10 * (promised[4].promise - changed), abs=20)
    assert ninth.promise - fifth.promise == 4 * 500_000
    newcomer = admit(redis_client, [rate], lease=1)
    assert isinstance(newcomer, RateLimited) and newcomer.promise > ninth.promise
    control.clear_rate(redis_client, "lower")


def served_in_line(commands: List[List[str]], name: str) -> List[str]:
    """The tickets of semaphore ``name``'s line in the order they were served a slot:
    handed a reserved one (``ZADD <semaphore> <end> ~<ticket>``) or admitted at the
    front of the line (``HSET <line hash> d:<ticket>``), each once (read with MONITOR:
    the order the lock store decided, not the order loaded workers ran the bodies)."""
    key = semaphore_key(name, PREFIX)
    hashed, served = companion_key(key, "w"), []
    for words in commands:
        command, ticket = words[0].upper(), None
        if command == "ZADD" and words[1] == key and words[3].startswith("~"):
            ticket = words[3][1:]
        elif command == "HSET" and words[1] == hashed and words[2].startswith("d:"):
            ticket = words[2][2:]
        if ticket and ticket not in served:
            served.append(ticket)
    return served


def most_in_any_window(starts: List[int], window_us: int) -> int:
    """The largest number of ``starts`` (sorted, µs) inside any half-open window."""
    most, first = 0, 0
    for last, start in enumerate(starts):
        while start - starts[first] >= window_us:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_a_promise_is_moved_once_however_often_its_run_asks(redis_client) -> None:
    """Raised from 1/s to 2/s: a run promised a start 6 s away is moved to about 3 s
    away, and asking again (twice) keeps that start: a moved promise is not moved
    again."""
    rate = RateLimit("once", Rate.parse("1/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    promised = [admit(redis_client, [rate], lease=1) for _ in range(6)]
    control.set_rate(redis_client, "once", "2/s")
    moved = admit(redis_client, [rate], lease=1, promises={rate.key: promised[-1].promise})
    assert isinstance(moved, RateLimited) and moved.promise < promised[-1].promise - 2_000_000
    for _ in range(2):
        again = admit(redis_client, [rate], lease=1, promises={rate.key: moved.promise})
        assert isinstance(again, RateLimited) and again.promise == moved.promise
    control.clear_rate(redis_client, "once")


def test_a_weighted_waiter_keeps_all_its_slots_until_its_start(redis_client) -> None:
    """A run of cost 2 on 2 slots, under 2/s (no burst): handed both slots, it is
    promised a start, and both of its reserved slots are kept until after it."""
    slot = SlotLimit("acct5", 2, PREFIX, cost=2)
    rate = RateLimit("api5", Rate.parse("2/s", burst=0), PREFIX)
    holder = admit(redis_client, [slot, rate], lease=30)
    assert isinstance(holder, Lease)
    run = Run(redis_client, [slot, rate], "t5")
    refused = run.ask("o:c1", ticket=False)
    assert isinstance(refused, Busy)
    join_line(redis_client, slot.key, run.ticket_id, refused.server_time_ms,
              "{}", "message", keep_ms=KEEP_MS, reserve_ms=RESERVE_MS, cost=2)
    holder._reserve_ms = RESERVE_MS
    holder.release()
    express = run.ask("e:c2", express=True)
    assert isinstance(express, RateLimited)
    ends = [redis_client.zscore(slot.key, f"~{run.ticket_id}{unit}") for unit in ("", "*2")]
    assert all(end is not None and end >= express.promise / 1000 + RESERVE_MS - 1
               for end in ends), ends
    assert isinstance(admit(redis_client, [SlotLimit("acct5", 2, PREFIX)], lease=1), Busy)
    wait_for_server_time(redis_client, express.promise)
    admitted = run.ask("o:c3", promise=express.promise)
    assert isinstance(admitted, Lease)
    admitted.release()


def test_rate_recheck_setting_is_checked() -> None:
    """``redislock_rate_recheck``: seconds above zero, or None."""
    from celery import Celery

    from celery_redislock.config.settings import read_settings
    from celery_redislock.errors import LockConfigurationError

    app = Celery(set_as_current=False)
    assert read_settings(app).rate_recheck == 1.0
    app.conf.redislock_rate_recheck = None
    assert read_settings(app).rate_recheck is None
    app.conf.redislock_rate_recheck = 30
    assert read_settings(app).rate_recheck == 30.0
    for bad in (0, -1, "1s", True, float("nan")):
        app.conf.redislock_rate_recheck = bad
        with pytest.raises(LockConfigurationError, match="redislock_rate_recheck"):
            read_settings(app)
