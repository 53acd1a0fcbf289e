"""The history checker's logic (tests/history/checker.py) on made-up histories: overlap
per key, admissions per rate window, lost runs and repeated bodies by cause. Pure, fast."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from history.checker import ACK_WINDOW, KILLED_BEFORE_ACK, OPEN, check, most_in_window
from history.table import render

S = 1_000_000  # one second, in µs


def sent(task: str, t: int = 0, *, slots: int = 1, cost: int = 1, key: str = "k",
         acks_late: bool = True, rate: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    limits = [] if rate else [{"key": key, "slots": slots, "cost": cost}]
    return {"kind": "sent", "t": t, "task": task, "name": "kind", "acks_late": acks_late,
            "limits": limits, "rate": rate}


def body(task: str, run: str, start: int, end: Optional[int], *, pid: int = 100,
         worker: str = "worker1", admitted_ms: Optional[int] = None,
         redelivered: Optional[bool] = None,
         copy: Optional[bool] = None) -> List[Dict[str, Any]]:
    events: List[Dict[str, Any]] = [
        {"kind": "start", "t": start, "task": task, "run": run, "pid": pid,
         "worker": worker, "admitted_ms": admitted_ms, "redelivered": redelivered,
         "copy": copy}]
    if end is not None:
        events.append({"kind": "end", "t": end, "task": task, "run": run})
    return events


def final(task: str, state: str = "SUCCESS", error: str = "") -> Dict[str, Any]:
    return {"kind": "final", "t": 1000 * S, "task": task, "state": state, "error": error}


def fault(t: int, kind: str, *, pids: Any = (), worker: str = "",
          data_lost: bool = False) -> Dict[str, Any]:
    return {"kind": "fault", "t": t, "fault": kind, "pids": list(pids), "worker": worker,
            "data_lost": data_lost}


SETTLE = {"kind": "settle", "t": 2000 * S, "held": {"k": 0}, "no_ttl": []}


def test_a_clean_history_passes_and_renders() -> None:
    events = [sent("a"), sent("b"), *body("a", "a1", 1 * S, 2 * S),
              *body("b", "b1", 2 * S, 3 * S), final("a"), final("b"), SETTLE]
    verdict = check(events)
    assert verdict.defects() == []
    assert [(p.key, p.most, p.slots) for p in verdict.peaks] == [("k", 1, 1)]
    assert "verdict: PASS" in render("seed 1", verdict, {"seed": 1})


def test_two_bodies_overlapping_on_one_slot_is_a_violation() -> None:
    events = [sent("a"), sent("b"), *body("a", "a1", 1 * S, 3 * S),
              *body("b", "b1", 2 * S, 4 * S, pid=101), final("a"), final("b"), SETTLE]
    verdict = check(events)
    assert verdict.peaks[0].most == 2 and verdict.peaks[0].runs == ("a1", "b1")
    assert any("2 slots taken at once, of 1" in defect for defect in verdict.defects())
    assert "OVER" in render("seed 1", verdict, {})


def test_weighted_runs_count_their_cost() -> None:
    events = [sent("a", slots=4, cost=3), sent("b", slots=4, cost=2),
              *body("a", "a1", 1 * S, 3 * S), *body("b", "b1", 2 * S, 4 * S, pid=101),
              final("a"), final("b"), SETTLE]
    assert check(events).peaks[0].most == 5


def test_a_killed_body_is_open_until_its_kill() -> None:
    # a1 never ends; its pool process is killed at 5 s: b1 starting at 4 s overlaps it,
    # c1 starting at 6 s does not.
    events = [sent("a"), sent("b"), sent("c"), *body("a", "a1", 1 * S, None, pid=7),
              fault(5 * S, "kill_child", pids=[7]), *body("b", "b1", 4 * S, 4 * S + 1),
              *body("c", "c1", 6 * S, 7 * S), final("b"), final("c"), SETTLE]
    verdict = check(events)
    assert verdict.peaks[0].most == 2 and verdict.peaks[0].runs == ("a1", "b1")
    assert verdict.unended == []


def test_a_body_that_never_ends_unkilled_stays_open_and_is_a_defect() -> None:
    events = [sent("a"), *body("a", "a1", 1 * S, None), final("a"), SETTLE]
    verdict = check(events)
    assert verdict.unended == ["a1"]
    assert any("never ended" in defect for defect in verdict.defects())


def test_a_hand_over_at_the_same_instant_is_not_overlap() -> None:
    events = [sent("a"), sent("b"), *body("a", "a1", 1 * S, 2 * S),
              *body("b", "b1", 2 * S, 3 * S), final("a"), final("b"), SETTLE]
    assert check(events).peaks[0].most == 1


def test_rate_window_is_half_open_and_counts_rate_plus_burst() -> None:
    # 5/s with a burst of 1: 6 in any one second; the 7th at exactly +1 s is outside.
    rate = {"key": "r", "count": 5, "period_us": S, "burst": 1}
    moments = [0, 0, 200, 400, 600, 800, 1000]
    events = [sent(f"t{i}", rate=rate) for i in range(len(moments))]
    for i, ms in enumerate(moments):
        events += body(f"t{i}", f"r{i}", 5 * S + i, 5 * S + i + 1, admitted_ms=ms)
    verdict = check([*events, SETTLE])
    assert (verdict.rates[0].most, verdict.rates[0].allowed) == (6, 6)
    assert not verdict.rates[0].over
    events += body("t7", "r7", 5 * S + 9, 5 * S + 10, admitted_ms=999)
    events.append(sent("t7", rate=rate))
    assert check([*events, SETTLE]).rates[0].over


def test_rate_windows_across_a_data_loss_are_counted_apart() -> None:
    rate = {"key": "r", "count": 1, "period_us": S, "burst": 0}
    events = [sent("a", rate=rate), sent("b", rate=rate),
              received("a", 0), *body("a", "a1", 0, 1, admitted_ms=0),
              fault(500_000, "store_restart", data_lost=True),
              received("b", 550_000), *body("b", "b1", 600_000, 600_001, admitted_ms=600),
              SETTLE]
    verdict = check(events)
    assert (verdict.rates[0].most, verdict.rates[0].across_loss) == (1, 2)
    assert not verdict.rates[0].over


def rate_after_a_loss(booked_received: int) -> List[Dict[str, Any]]:
    """Seed 3 without persistence (1,500 tasks), its figures (ms from the run's start):
    4/s with a burst of 1; the lock store came back empty at 156,835; a run received at
    ``booked_received`` started at 157,020, its start booked then; six newcomers, received
    after the restart, admitted by the empty limiter at 156,859, 156,870, 157,109,
    157,359, 157,619 and 157,859 (on its 250 ms grid)."""
    ms = 1000
    rate = {"key": "r", "count": 4, "period_us": S, "burst": 1}
    events = [fault(156_835 * ms, "store_restart", data_lost=True), sent("b", rate=rate),
              received("b", booked_received * ms),
              *body("b", "b1", 157_024 * ms, 157_152 * ms, admitted_ms=157_020)]
    for i, start in enumerate((156_859, 156_870, 157_109, 157_359, 157_619, 157_859)):
        events += [sent(f"n{i}", rate=rate), received(f"n{i}", 156_842 * ms + i),
                   *body(f"n{i}", f"n{i}1", (start + 3) * ms, (start + 90) * ms,
                         admitted_ms=start)]
    return [*events, SETTLE]


def test_a_start_booked_before_a_data_loss_counts_across_it() -> None:
    # Received 0.28 s before the loss and booked 0.47 s ahead: the limiter that counted
    # it may be the one the loss emptied, which the newcomers' limiter never knew.
    booked_before = check(rate_after_a_loss(booked_received=156_554)).rates[0]
    assert (booked_before.most, booked_before.allowed) == (4, 5)  # the windows without it
    assert booked_before.across_loss == 6 and not booked_before.over
    # Received after the loss: one limiter counted all seven, and 6 in one period is over.
    booked_after = check(rate_after_a_loss(booked_received=156_840)).rates[0]
    assert (booked_after.most, booked_after.over) == (6, True)


def test_most_in_window() -> None:
    assert most_in_window([0, 1, 2, 10], 3, []) == (3, 0)
    assert most_in_window([0, 1, 2, 10], 3, [2]) == (1, 3)
    assert most_in_window([], 3, []) == (0, 0)
    # Counted no later than their moments: the window of 5 and 6 spans the loss at 4.
    assert most_in_window([5, 6, 10], 3, [4], [3, 6, 10]) == (1, 2)


def test_a_task_without_a_final_state_is_lost() -> None:
    events = [sent("a"), *body("a", "a1", 1 * S, 2 * S), SETTLE]
    verdict = check(events)
    assert verdict.lost == ["a"] and verdict.states == {"MISSING": 1}
    served = check([*events, {"kind": "served", "t": 3 * S, "task": "a", "pid": 7}])
    assert served.defects() == [
        "lost: task a never reached a final state (a delivery of it ended as served by "
        "another copy)"]


def received(task: str, t: int, *, pid: int = 50, worker: str = "worker1",
             redelivered: bool = False) -> Dict[str, Any]:
    return {"kind": "received", "t": t, "task": task, "pid": pid, "worker": worker,
            "redelivered": redelivered, "copy": False}


def accepted(task: str, t: int, *, pid: int = 50, worker: str = "worker1") -> Dict[str, Any]:
    return {"kind": "accepted", "t": t, "task": task, "pid": pid, "worker": worker}


def settled(*unacked: str) -> Dict[str, Any]:
    return {**SETTLE, "unacked_tasks": list(unacked)}


def test_lost_runs_by_cause() -> None:
    events = [
        # default acks, its body killed with its whole worker: Celery's own loss
        sent("celery", acks_late=False), *body("celery", "c1", 1 * S, None, pid=9),
        # never started, a worker killed whole 1.5 s after it was sent, but no delivery
        # of it recorded: lost (a defect)
        sent("waiting", 1 * S + 500_000),
        fault(3 * S, "kill_worker", pids=[9], worker="worker1"),
        # never started, no worker killed since it was sent: lost
        sent("late", 4 * S),
        # never received by any worker, a worker killed whole 300 ms after it was sent
        # (or 50 ms before its record): taken off its queue by that worker's BRPOP
        sent("popped", 10 * S), fault(10 * S + 300_000, "kill_worker", worker="worker2"),
        sent("popped2", 20 * S + 50_000), fault(20 * S, "kill_worker", worker="worker3"),
        # ... but not one killed 2 s after it was sent
        sent("queued", 30 * S), fault(32 * S, "kill_worker", worker="worker2"),
        settled()]
    verdict = check(events)
    assert (verdict.lost_by_celery, verdict.lost_known, verdict.lost,
            verdict.lost_in_transport) == (
        ["celery"], [], ["waiting", "late", "queued"], ["popped", "popped2"])
    assert "runs lost by kombu (BRPOP, then killed)  2" in render("seed 1", verdict, {})


def test_a_message_taken_from_a_backlog_by_a_killed_worker_is_kombus_loss() -> None:
    """With a backlog the message is taken off the queue long after its send (history
    check, seed 2 with AOF on 5740134: received neighbours 3.68 s and 3.80 s after its
    send, a worker killed whole at 3.98 s): its neighbours in the queue bound when."""
    def received(task: str, t: int) -> Dict[str, Any]:
        return {"kind": "received", "t": t, "task": task, "worker": "worker1", "pid": 1}

    events = [sent("before", 9 * S + 500_000), sent("popped", 10 * S),
              sent("after", 10 * S + 176_000), received("before", 13 * S + 684_000),
              received("after", 13 * S + 796_000),
              fault(13 * S + 980_000, "kill_worker", worker="worker3"),
              sent("b2", 20 * S), sent("kept", 21 * S), sent("a2", 22 * S),
              received("b2", 30 * S), received("a2", 31 * S),
              fault(27 * S, "kill_worker", worker="worker2"),  # before it could be taken
              final("before"), final("after"), final("b2"), final("a2"), settled()]
    verdict = check(events)
    assert (verdict.lost_in_transport, verdict.lost) == (["popped"], ["kept"])


def test_a_lost_run_is_known_only_when_its_last_receiver_was_killed_before_the_body() -> None:
    """worker1's main process (pid 50; its pool process 51) received the task's message
    last, at 5 s, and was killed whole at 6 s, before any body of it started: the message
    stayed in the broker's ``unacked`` hash (kombu restores it only after the visibility
    timeout, from a live worker's sweep). Known while that is so once settled; with
    default acks, accepted by the pool before the kill, acknowledged: Celery's own."""
    kill = fault(6 * S, "kill_worker", pids=[50, 51], worker="worker1")

    def lost(task: str, *events: Dict[str, Any], acks_late: bool = True,
             unacked: bool = True) -> str:
        verdict = check([sent(task, acks_late=acks_late), *events, kill,
                         settled(*([task] if unacked else []))])
        causes = {"celery": verdict.lost_by_celery, "known": verdict.lost_known,
                  "transport": verdict.lost_in_transport, "lost": verdict.lost}
        return next(cause for cause, tasks in causes.items() if task in tasks)

    # An earlier delivery (worker2) refused it; worker1 received it last and was killed.
    assert lost("a", received("a", 1 * S, pid=70, worker="worker2"), received("a", 5 * S)) \
        == "known"
    # The same, but its message was restored (not in unacked once settled): then the
    # broker gave it back and no worker received it again, or it was acknowledged: lost.
    assert lost("b", received("b", 5 * S), unacked=False) == "lost"
    # Its last receiver was another worker, never killed: lost.
    assert lost("c", received("c", 1 * S), received("c", 5 * S, pid=70, worker="worker2")) \
        == "lost"
    # Killed before it received it (the kill is of an earlier delivery): lost.
    assert lost("d", received("d", 7 * S)) == "lost"
    # A body of it started after that receipt (and ended): not this window.
    assert lost("e", received("e", 5 * S), *body("e", "e1", 5 * S + 10, 5 * S + 20, pid=51)) \
        == "lost"
    # No delivery recorded at all, sent 6 s before the kill: lost.
    assert lost("f") == "lost"
    # Default acks, accepted by worker1's pool before the kill: acknowledged, Celery's own.
    assert lost("g", received("g", 5 * S), accepted("g", 5 * S + 1000), acks_late=False,
                unacked=False) == "celery"
    # Default acks, not accepted: not acknowledged, so only known while still unacked.
    assert lost("h", received("h", 5 * S), acks_late=False) == "known"
    assert lost("i", received("i", 5 * S), acks_late=False, unacked=False) == "lost"
    # acks_late, accepted: the accept acknowledges nothing.
    assert lost("j", received("j", 5 * S), accepted("j", 5 * S + 1000),
                unacked=False) == "lost"
    # Accepted by another worker's delivery, earlier: not this delivery's.
    assert lost("k", accepted("k", 4 * S, pid=70, worker="worker2"), received("k", 5 * S),
                acks_late=False, unacked=False) == "lost"
    assert "lost: task b never reached a final state" in check(
        [sent("b"), received("b", 5 * S), kill, settled()]).defects()


def test_a_killed_body_failing_with_worker_lost_is_not_a_defect() -> None:
    events = [sent("a", acks_late=False), sent("b"), *body("a", "a1", 1 * S, None, pid=5),
              fault(2 * S, "kill_child", pids=[5]), *body("b", "b1", 3 * S, 4 * S),
              final("a", "FAILURE", "WorkerLostError"), final("b", "FAILURE", "ValueError"),
              SETTLE]
    assert check(events).failed == {"b": "ValueError"}


def test_repeats_by_cause() -> None:
    events = [
        # acks_late, killed mid-body, ran again: explained
        sent("killed"), *body("killed", "k1", 1 * S, None, pid=5),
        fault(2 * S, "kill_child", pids=[5]), *body("killed", "k2", 3 * S, 4 * S, pid=6),
        # acks_late, its worker killed whole after the body ended (before the ack)
        sent("acked", key="k2"), *body("acked", "a1", 1 * S, 2 * S, pid=11, worker="w2"),
        fault(2 * S + 5, "kill_worker", pids=[11], worker="w2"),
        *body("acked", "a2", 5 * S, 6 * S, pid=12),
        # default acks, killed, ran again: not explained by Celery
        sent("early", key="k3", acks_late=False), *body("early", "e1", 1 * S, None, pid=8),
        fault(2 * S, "kill_child", pids=[8]), *body("early", "e2", 3 * S, 4 * S, pid=13),
        # ran again after the lock store came back empty: known
        sent("waited", key="k4", acks_late=False),
        *body("waited", "w1", 10 * S, 11 * S, pid=20),
        fault(12 * S, "store_restart", data_lost=True),
        *body("waited", "w2", 13 * S, 14 * S, pid=21),
        final("killed"), final("acked"), final("early"), final("waited"), SETTLE,
    ]
    verdict = check(events)
    assert sorted(verdict.repeated_explained) == ["a2", "k2"]
    assert verdict.repeated_known == ["w2"]
    assert verdict.repeated_unexplained == ["e2"]
    assert "ran again, unexplained: e2" in verdict.defects()


def refused(task: str, t: int, pid: int) -> Dict[str, Any]:
    return {"kind": "lock_contended", "t": t, "task": task, "pid": pid, "key": "k"}


def test_a_worker_killed_between_a_refusals_copy_and_the_ack_is_known() -> None:
    """Default acks: worker1's main process (pid 50) refuses the message the task was
    sent as, publishes its waiting copy, records the refusal and is killed whole before
    it acknowledges the message; the copy runs, and the message, never acknowledged,
    comes back after the visibility timeout and runs again."""
    def history(task: str, *, kill_at: int, again_redelivered: Optional[bool] = True,
                again_copy: Optional[bool] = False, acks_late: bool = False,
                kill_pids: Any = (50, 51)) -> List[Dict[str, Any]]:
        return [sent(task, acks_late=acks_late), refused(task, 1 * S, 50),
                fault(kill_at, "kill_worker", pids=kill_pids, worker="worker1"),
                *body(task, f"{task}1", 2 * S, 3 * S, pid=60, worker="worker2", copy=True,
                      redelivered=False),
                *body(task, f"{task}2", 45 * S, 46 * S, pid=61, worker="worker2",
                      redelivered=again_redelivered, copy=again_copy),
                final(task)]

    proven = check([*history("a", kill_at=1 * S + 300_000), SETTLE])
    assert (proven.repeated_known, proven.repeated_unexplained) == (["a2"], [])
    assert proven.known_causes == {"a2": KILLED_BEFORE_ACK} and proven.defects() == []
    assert f"1 {KILLED_BEFORE_ACK}" in render("seed 2", proven, {})
    for unproven in (
            history("b", kill_at=1 * S + ACK_WINDOW + 1),  # killed long after: acknowledged
            history("c", kill_at=1 * S - 1),  # killed before the record: not that refusal
            history("d", kill_at=1 * S + 300_000, kill_pids=(70,)),  # another worker
            history("e", kill_at=1 * S + 300_000, again_redelivered=False),  # not redelivered
            history("f", kill_at=1 * S + 300_000, again_redelivered=None),  # not recorded
            history("g", kill_at=1 * S + 300_000, again_copy=None)):  # not recorded
        verdict = check([*unproven, SETTLE])
        assert verdict.repeated_known == [] and len(verdict.repeated_unexplained) == 1, unproven
    # A copy redelivered: refused by worker1 (its third refusal there) 59 ms before the
    # kill; the copy that refusal published ran, and the refused copy again.
    copy = [sent("j", acks_late=False), refused("j", 1 * S, 50), refused("j", 1 * S + 50_000, 50),
            refused("j", 1 * S + 116_000, 50),
            fault(1 * S + 175_000, "kill_worker", pids=[50, 51], worker="worker1"),
            *body("j", "j1", 2 * S, 3 * S, pid=60, copy=True, redelivered=False),
            *body("j", "j2", 41 * S, 42 * S, pid=61, copy=True, redelivered=True),
            final("j"), SETTLE]
    assert check(copy).known_causes == {"j2": KILLED_BEFORE_ACK}
    # Under acks_late too: the refused message never reached the pool.
    late = check([*history("h", kill_at=1 * S + 300_000, acks_late=True), SETTLE])
    assert late.known_causes == {"h2": KILLED_BEFORE_ACK}
    # Only the task's first refusal is the refusal of the message it was sent as.
    later = [sent("i", acks_late=False), refused("i", 1 * S, 50), refused("i", 5 * S, 52),
             fault(5 * S + 10, "kill_worker", pids=[52], worker="worker3"),
             *body("i", "i1", 6 * S, 7 * S, pid=60, copy=True, redelivered=False),
             *body("i", "i2", 45 * S, 46 * S, pid=61, redelivered=True, copy=False),
             final("i"), SETTLE]
    assert check(later).repeated_unexplained == ["i2"]


def test_settle_figures_are_defects() -> None:
    events = [sent("a"), *body("a", "a1", 1 * S, 2 * S), final("a"),
              {"kind": "settle", "t": 9 * S, "held": {"k": 1}, "no_ttl": ["redislock:x"]}]
    defects = check(events).defects()
    assert "k: 1 slots still held once settled" in defects
    assert "redislock:x: lock store key without a time to live" in defects


def test_parking_leftovers_once_settled_are_defects() -> None:
    events = [sent("a"), *body("a", "a1", 1 * S, 2 * S), final("a"),
              {"kind": "settle", "t": 9 * S, "held": {}, "no_ttl": [],
               "parked": {"k: parked line waiting": 2, "k: parked line reserved": 0}}]
    assert check(events).defects() == ["k: parked line waiting: 2 left once settled"]


def test_a_history_without_settling_is_a_defect() -> None:
    verdict = check([sent("a"), *body("a", "a1", 1 * S, 2 * S), final("a")])
    assert not verdict.settled and verdict.defects()
    assert OPEN > 10**18


def test_a_lease_lost_is_a_defect_only_when_the_store_kept_its_data() -> None:
    events = [sent("a"), *body("a", "a1", 1 * S, 2 * S), final("a"), SETTLE,
              {"kind": "lease_lost", "t": 1 * S + 5, "task": "a"}]
    assert check(events).defects() == []
    kept = check([*events, {"kind": "run", "t": 0, "persistence": "aof"}])
    assert kept.defects() == ["1 lease(s) lost though the lock store kept its data"]


def test_the_served_line_is_read_where_the_package_writes_it(caplog: Any) -> None:
    """The history's ``served`` events come from the package's DEBUG line: its logger
    and its arguments are those the workers' filter reads."""
    from celery.app.task import Context

    from celery_redislock.line.waiting import served

    from history.app import ENDS_UNRUN_LOGGER, served_fields

    class Task:
        name = "history.slot.late"

    with caplog.at_level(logging.DEBUG, logger=ENDS_UNRUN_LOGGER):
        served(Task(), Context({"id": "t1"}), "slot:1")
    [record] = [r for r in caplog.records if r.name == ENDS_UNRUN_LOGGER]
    assert served_fields(record) == {"task": "t1", "key": "slot:1"}
