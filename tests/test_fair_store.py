"""Fair shares on the parked line, the lock store's side (``engine/fair.py``,
``lua/fair.lua``): which sub-line a freed slot goes to, on a real redis-server. The
broker is played by one FIFO per sub-line of (task, park ref)."""

from __future__ import annotations

import collections
import time
from typing import Any, Deque, Dict, List, Tuple

import pytest

from celery_redislock.config.limit import TaskLimits
from celery_redislock.engine.admission import Busy, Lease, ParkedMove, ParkRef, SlotLimit
from celery_redislock.engine.fair import (
    check_weight,
    fair_view,
    oldest_waiters,
    set_weight,
    weights,
)
from celery_redislock.engine.parked_view import read_parked_lines
from celery_redislock.engine.parking import (
    due,
    moved_nothing,
    park_admit,
    run_id,
    took_from_sub_line,
)

PREFIX = "redislock:"


class Line:
    """A fair limit of ``slots``, its holders, and the broker's parking queues."""

    def __init__(self, client: Any, slots: int = 1, name: str = "fair") -> None:
        self.client, self.slots, self.name = client, slots, name
        self.queues: Dict[str, Deque[Tuple[str, ParkRef]]] = collections.defaultdict(
            collections.deque)
        self.holders: Deque[Tuple[str, Lease]] = collections.deque()
        self.owed: List[ParkedMove] = []

    def limiters(self, sub: str) -> List[SlotLimit]:
        return [SlotLimit(self.name, self.slots, PREFIX, 1, sub)]

    @property
    def key(self) -> str:
        return self.limiters("")[0].key

    def send(self, sub: str, task: str) -> Any:
        outcome = park_admit(self.client, self.limiters(sub), lease=30, run=run_id(task, 0))
        self._settle(sub, task, outcome)
        return outcome

    def _settle(self, sub: str, task: str, outcome: Any) -> None:
        if isinstance(outcome, Lease):
            self.holders.append((sub, outcome))
        elif isinstance(outcome, Busy):
            assert outcome.park is not None and outcome.park.sub == sub
            self.queues[sub].append((task, outcome.park))
        self.owed.extend(h for h in outcome.handoffs if isinstance(h, ParkedMove))

    def finish_one(self) -> str:
        """The oldest holder releases; every move owed is done (the moved copies ask);
        the sub-line of the run that took the slot."""
        _, lease = self.holders.popleft()
        lease.release()
        self.owed.extend(h for h in lease.handoffs if isinstance(h, ParkedMove))
        while self.owed:
            move = self.owed.pop(0)
            assert move.key == self.key
            task, ref = self.queues[move.sub].popleft()
            outcome = park_admit(self.client, self.limiters(move.sub), lease=30,
                                 run=run_id(task, 0), parked=ref)
            assert isinstance(outcome, Lease), outcome
            self._settle(move.sub, task, outcome)
        return self.holders[-1][0]


def test_a_backlog_does_not_hold_back_other_sub_lines(redis_client):
    line = Line(redis_client)
    assert isinstance(line.send("tenant:big", "first"), Lease)
    for n in range(200):
        assert isinstance(line.send("tenant:big", f"big{n}"), Busy)
    for t in range(5):
        for n in range(2):
            line.send(f"tenant:s{t}", f"s{t}.{n}")
    served = [line.finish_one() for _ in range(20)]
    # Round robin: every small tenant within its first turns, not behind 200 runs.
    last_small = max(i for i, sub in enumerate(served) if sub != "tenant:big")
    assert last_small < 12, served
    assert served.count("tenant:big") >= 8
    view = fair_view(redis_client, line.key, top=3)
    assert view.waiting == 1 and view.first[0].sub == "tenant:big"
    assert view.first[0].waiting == 200 - served.count("tenant:big")


def test_weights_give_turns_in_proportion(redis_client):
    line = Line(redis_client)
    set_weight(redis_client, line.key, "tenant:a", 3)
    assert weights(redis_client, line.key) == {"tenant:a": 3.0}
    line.send("tenant:a", "first")
    for n in range(300):
        line.send("tenant:a", f"a{n}")
        line.send("tenant:b", f"b{n}")
    served = [line.finish_one() for _ in range(200)]
    assert served.count("tenant:a") / len(served) == pytest.approx(0.75, abs=0.02)
    set_weight(redis_client, line.key, "tenant:a", 1)  # back to the default
    assert weights(redis_client, line.key) == {}


def test_a_sub_line_joining_late_gets_no_credit_for_time_it_did_not_wait(redis_client):
    line = Line(redis_client)
    line.send("tenant:a", "first")
    for n in range(50):
        line.send("tenant:a", f"a{n}")
    first = [line.finish_one() for _ in range(20)]
    assert first == ["tenant:a"] * 20
    for n in range(10):
        line.send("tenant:b", f"b{n}")
    # b starts at the virtual time: it alternates with a, it does not run 10 in a row.
    then = [line.finish_one() for _ in range(10)]
    assert then.count("tenant:b") == 5


def test_a_line_without_fair_by_is_first_come_first_served(redis_client):
    line = Line(redis_client, name="plain")
    holder = park_admit(redis_client, [SlotLimit("plain", 1, PREFIX)], lease=30,
                        run=run_id("h", 0))
    waiter = park_admit(redis_client, [SlotLimit("plain", 1, PREFIX)], lease=30,
                        run=run_id("w", 0))
    assert isinstance(holder, Lease) and isinstance(waiter, Busy)
    assert waiter.park is not None and waiter.park.sub == ""
    holder.release()
    assert holder.handoffs == [ParkedMove(line.key)]
    assert fair_view(redis_client, line.key).waiting == 0


def test_fair_by_is_a_template_of_the_run(redis_client):
    def work(tenant: str, n: int = 0) -> None:
        pass

    limits = TaskLimits.compile("proj.work", work, [
        {"slots": 2, "fair_by": "tenant:{tenant}"}, {"slots": 1, "key": "tenant:{tenant}"}])
    first, per_tenant = limits.limiters(("acme",), {}, PREFIX)
    assert isinstance(first, SlotLimit) and first.fair == "tenant:acme"
    assert isinstance(per_tenant, SlotLimit) and per_tenant.fair == ""


@pytest.mark.parametrize("weight", [0, -1, "x", float("nan"), True, 1e9])
def test_a_weight_must_be_a_positive_number(weight):
    with pytest.raises(ValueError):
        check_weight(weight)


def send_priority(line: Line, task: str, priority: int, aging: float) -> Any:
    outcome = park_admit(line.client, line.limiters(""), lease=30, run=run_id(task, 0),
                         priority=priority, priority_aging=aging)
    line._settle(outcome.park.sub if isinstance(outcome, Busy) else "", task, outcome)
    return outcome


def test_a_higher_priority_goes_first_and_a_lower_one_ages(redis_client):
    """Band 0 waits behind band 5 while the band-5 runs are younger than 5 x aging
    (= 1 s) after it; then it goes first."""
    line = Line(redis_client, name="prio")
    assert isinstance(send_priority(line, "holder", 0, 0.2), Lease)
    for n in range(3):
        assert send_priority(line, f"low{n}", 0, 0.2).park.sub == "\x1e0"
    for n in range(3):
        send_priority(line, f"high{n}", 5, 0.2)
    served = [line.finish_one() for _ in range(3)]
    assert served == ["\x1e5"] * 3  # higher first
    time.sleep(1.1)  # the low runs have waited more than (5 - 0) x 0.2 s
    for n in range(3):
        send_priority(line, f"late-high{n}", 5, 0.2)
    served = [line.finish_one() for _ in range(6)]
    assert served == ["\x1e0"] * 3 + ["\x1e5"] * 3


def test_a_sub_lines_state_keeps_a_time_to_live_once_its_last_run_is_moved(redis_client):
    line = Line(redis_client)
    assert isinstance(line.send("tenant:a", "first"), Lease)
    assert isinstance(line.send("tenant:a", "second"), Busy)
    assert line.finish_one() == "tenant:a"  # its sub-line empties: its state is written anew
    state = line.key.replace("}:s:", "}:fn:")
    assert redis_client.exists(state) and redis_client.pttl(state) > 0


def test_a_move_that_found_its_sub_lines_queue_empty_is_owed_again_from_it(redis_client):
    """The race the history check found on the broker line: a run is refused (its
    reference and its sub-line's turn written), and a release owes a move for it before
    its worker published the parked copy; the move finds the queue empty and gives the
    reservation back (``moved_nothing``). Once the copy is in its queue, the poll must
    owe a move out of that sub-line's queue."""
    line = Line(redis_client, name="race")
    assert isinstance(send_priority(line, "holder", 0, 10.0), Lease)
    parked = send_priority(line, "late", 0, 10.0)
    assert isinstance(parked, Busy) and parked.park is not None
    sub = parked.park.sub
    _, lease = line.holders.popleft()
    lease.release()
    owed = [h for h in lease.handoffs if isinstance(h, ParkedMove)]
    assert owed == [ParkedMove(line.key, sub)]
    assert moved_nothing(redis_client, line.key, sub)  # the copy was not published yet
    moves = due(redis_client, {line.key: 1}, prefix=PREFIX)  # now it is: 1 in its queue
    assert moves == [ParkedMove(line.key, sub)]


def test_a_copy_published_after_the_grace_is_moved_from_the_lines_own_queue(redis_client):
    """Past the publish grace an empty move drops its sub-line's count; the line still
    counts the reference, so the poll owes a move from the line's own queue (the mover
    takes it from the sub-lines it saw holding messages: line/moves.py)."""
    line = Line(redis_client, name="late-publish")
    assert isinstance(line.send("tenant:x", "holder"), Lease)
    parked = line.send("tenant:a", "late")
    assert isinstance(parked, Busy) and parked.park is not None
    _, lease = line.holders.popleft()
    lease.release()
    assert [h.sub for h in lease.handoffs if isinstance(h, ParkedMove)] == ["tenant:a"]
    assert moved_nothing(redis_client, line.key, "tenant:a", publish_grace_ms=0)
    assert due(redis_client, {line.key: 1}, prefix=PREFIX) == [ParkedMove(line.key, "")]


def owed_after_an_empty_move(line: Line, grace_ms: int, rounds: int) -> List[str]:
    """The sub-lines moves are owed from, ``rounds`` moves in a row, while every move
    owed from 'tenant:a' (counted, nothing parked) finds its queue empty and
    ``moved_nothing`` gives its reservation back (the poll hands it over again), and
    each other move takes its copy, which runs and releases (handing over)."""
    subs: List[str] = []
    owed: List[ParkedMove] = []
    for _ in range(rounds):
        if not owed:
            parked = sum(len(queue) for queue in line.queues.values())
            owed = due(line.client, {line.key: parked}, prefix=PREFIX)
        assert len(owed) == 1, owed
        sub = owed.pop().sub
        subs.append(sub)
        if sub == "tenant:a":
            assert moved_nothing(line.client, line.key, sub, publish_grace_ms=grace_ms)
            continue
        task, ref = line.queues[sub].popleft()
        outcome = park_admit(line.client, line.limiters(sub), lease=30,
                             run=run_id(task, 0), parked=ref)
        assert isinstance(outcome, Lease), outcome
        outcome.release()
        owed = [h for h in outcome.handoffs if isinstance(h, ParkedMove)]
    return subs


@pytest.mark.parametrize("grace_ms", [0, 60_000])
def test_a_sub_line_counted_with_nothing_parked_does_not_attract_every_move(
        redis_client, grace_ms):
    """A sub-line counted as waiting whose copy another move took (a phantom): its empty
    move used to count it again FIRST, so every later move went to it, found nothing
    and gave its slot back (the slot lost for the whole run). Within the publish grace
    it is counted again at its own turn, so the other sub-line is served in between;
    past the grace its count is dropped, and it is never owed a move again."""
    line = Line(redis_client, name=f"phantom{grace_ms}")
    _, holder = line.send("tenant:x", "holder"), line.holders.popleft()[1]
    assert isinstance(line.send("tenant:a", "a1"), Busy)
    for n in range(6):
        assert isinstance(line.send("tenant:b", f"b{n}"), Busy)
    line.queues["tenant:a"].clear()  # its copy taken by another move: nothing parked
    holder.release()
    assert [m.sub for m in holder.handoffs if isinstance(m, ParkedMove)] == ["tenant:a"]
    assert moved_nothing(redis_client, line.key, "tenant:a", publish_grace_ms=grace_ms)
    subs = owed_after_an_empty_move(line, grace_ms, 6)
    if grace_ms:
        assert subs[0] == "tenant:b" and subs.count("tenant:b") >= 3, subs
    else:
        assert subs == ["tenant:b"] * 6, subs


def test_a_copy_taken_by_a_move_from_the_lines_own_queue_is_counted_less(redis_client):
    """A move owed from the line's own queue (references no sub-line counts) that the
    mover took from a sub-line holding messages: that sub-line counts one copy less, so
    it is not left counted as waiting with nothing parked; one that counts none keeps
    nothing to take. With priority bands, its band's head goes too."""
    line = Line(redis_client, name="took")
    assert isinstance(line.send("tenant:x", "holder"), Lease)
    assert isinstance(line.send("tenant:a", "a1"), Busy)
    banded = send_priority(line, "p1", 3, 0.2)
    assert isinstance(banded, Busy) and banded.park is not None
    assert took_from_sub_line(redis_client, line.key, "tenant:a")
    assert not took_from_sub_line(redis_client, line.key, "tenant:a")  # counts none now
    assert took_from_sub_line(redis_client, line.key, banded.park.sub)
    assert fair_view(redis_client, line.key, top=3).waiting == 0
    tenant = banded.park.sub.split("\x1e")[0]
    assert not redis_client.exists(line.key.replace("}:s:", "}:fb:") + ":" + tenant)


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_the_oldest_waiter_of_a_tenant_is_read_from_its_bands_heads(redis_client):
    """A tenant whose runs wait in priority bands: its oldest waiter's age is the least
    'score + band x aging' over its bands' heads; a tenant without bands: unknown."""
    line = Line(redis_client, name="ages")
    assert isinstance(line.send("tenant:x", "holder"), Lease)
    before = server_ms(redis_client)
    first = park_admit(redis_client, line.limiters("tenant:a"), lease=30,
                       run=run_id("a1", 0), priority=0, priority_aging=0.2)
    after = server_ms(redis_client)
    assert isinstance(first, Busy)
    later = park_admit(redis_client, line.limiters("tenant:a"), lease=30,
                       run=run_id("a2", 0), priority=5, priority_aging=0.2)
    assert isinstance(later, Busy)  # band 5: score = since - 1 s, yet younger than a1
    assert isinstance(line.send("tenant:b", "b1"), Busy)  # no priority: no band

    asked = server_ms(redis_client)
    ages = oldest_waiters(redis_client, line.key, ["tenant:a", "tenant:b"], aging=0.2)
    now = server_ms(redis_client)
    assert set(ages) == {"tenant:a"}
    assert (asked - after) / 1000 <= ages["tenant:a"] <= (now - before) / 1000
    wrong = oldest_waiters(redis_client, line.key, ["tenant:a"], aging=0.0)
    assert wrong["tenant:a"] >= 1.0  # a2's head read without its band's 5 x 0.2 s

    view = fair_view(redis_client, line.key, top=5, aging=0.2)
    shown = {sub.sub: sub.oldest_age for sub in view.first}
    assert shown["tenant:b"] is None and shown["tenant:a"] is not None
    assert view.waiting == 2


def test_the_parked_view_counts_the_sub_lines_waiting(redis_client):
    line = Line(redis_client, name="count")
    assert isinstance(line.send("tenant:x", "holder"), Lease)
    for tenant in ("tenant:a", "tenant:b", "tenant:c"):
        assert isinstance(line.send(tenant, f"{tenant}-1"), Busy)
    assert isinstance(line.send("tenant:a", "tenant:a-2"), Busy)
    key = line.key
    found = read_parked_lines(redis_client, [key], server_ms(redis_client))[key]
    assert (found.fair_sub_lines, found.waiting) == (3, 4)

    plain = Line(redis_client, name="plain-bands")  # not fair, runs in bands
    assert isinstance(send_priority(plain, "holder", 0, 0.2), Lease)
    assert isinstance(send_priority(plain, "low", 0, 0.2), Busy)
    found = read_parked_lines(redis_client, [plain.key], server_ms(redis_client))[plain.key]
    assert (found.fair_sub_lines, found.waiting) == (0, 1)
