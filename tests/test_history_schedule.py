"""The history check's seeded plan of tasks and schedule of faults (tests/history/): the
same seed gives the same run, and the schedule keeps its promises. Pure, fast."""

from __future__ import annotations

from history.faults import KINDS, LONGEST_STOP, schedule
from history.workload import KIND, SHORTEST_LEASE, plan


def test_a_seed_replays() -> None:
    assert plan(3, 300, 90) == plan(3, 300, 90)
    assert schedule(3, 90, 45) == schedule(3, 90, 45)
    assert plan(3, 300, 90) != plan(4, 300, 90)
    assert schedule(3, 90, 45) != schedule(4, 90, 45)


def test_the_plan_sends_every_kind_half_with_acks_late() -> None:
    sends = plan(1, 300, 90)
    assert len(sends) == 300
    assert {send.kind for send in sends} == set(KIND)
    assert abs(sum(send.acks_late for send in sends) - 150) <= 1
    assert all(0 <= send.at <= 90 for send in sends)
    assert [send.at for send in sends] == sorted(send.at for send in sends)
    assert all(send.cost in (1, 2, 3) for send in sends if send.kind == "weighted")


def test_the_schedule_keeps_whole_kills_out_of_the_quiet_end_and_stops_short() -> None:
    for seed in range(1, 20):
        faults = schedule(seed, 90, 45)
        assert {fault.kind for fault in faults} <= set(KINDS)
        assert all(fault.at <= 45 for fault in faults if fault.kind == "kill_worker")
        assert all(fault.duration < SHORTEST_LEASE / 2 for fault in faults)
        assert LONGEST_STOP < SHORTEST_LEASE / 2
    kinds = {fault.kind for seed in range(1, 4) for fault in schedule(seed, 90, 45)}
    assert kinds == set(KINDS)
