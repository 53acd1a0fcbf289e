"""Fair hand-off: a freed slot goes at once to the oldest waiter, on real prefork workers.

With default settings (a one-second backoff), a backlog of 30 two-hundred-millisecond
tasks on two slots would leave slots idle between countdowns; with the waiting line,
each release hands its slot to the oldest waiter and re-publishes that waiter's message
at once. The task bodies record when they ran (see :mod:`worker_app`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator, List, Tuple

import pytest

from celery_redislock.engine.admission import Lease, SlotLimit, admit
from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.integration.handoff import publish, reservation_ms

from cluster_checks import (
    assert_each_ran_once,
    assert_slots_all_given_back,
    lock_store,
    lua_commands,
    peaks,
    record_store,
    wait_for_results,
    wait_until,
)
from worker_app import (
    HANDOFF_CRASH_ONCE,
    HANDOFF_KEY,
    HANDOFF_PATIENT,
    HANDOFF_PATIENT_KEY,
    HANDOFF_SLEEP,
    PATIENT_BACKOFF,
    PLAIN_ECHO,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


# The hand-off of the "store" line (its waiting line, re-published copies): pinned to it.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("store_line")]

PREFIX = "redislock:"


@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory) -> WorkerCluster:
    """Three worker processes with three prefork children each."""
    return worker_cluster_factory(workers=3, concurrency=3)


def line_keys(name: str) -> Dict[str, str]:
    key = semaphore_key(name, PREFIX)
    return {mark: companion_key(key, mark) for mark in ("q", "w", "x")}


def hold_by_hand(cluster: WorkerCluster, name: str, slots: int) -> List[Lease]:
    """Take every slot of ``name`` from the test process."""
    limit = SlotLimit(name, slots, PREFIX)
    return [admit(lock_store(cluster), [limit], lease=30) for _ in range(slots)]


def release_by_hand(cluster: WorkerCluster, held: List[Lease],
                    reserve_ms: int = reservation_ms(30), publish_handoffs: bool = True) -> None:
    """Give the slots back as a worker does: hand them to the line, and re-publish the
    waiters' messages (unless ``publish_handoffs`` is False: a releaser that died)."""
    for lease in held:
        lease._reserve_ms = reserve_ms
        lease.release()
        if publish_handoffs:
            publish(cluster.app, lease.handoffs)


def times(cluster: WorkerCluster, field: str) -> Dict[str, int]:
    return {task_id: int(us) for task_id, us in record_store(cluster).hgetall(field).items()}


def longest_stretch_with_a_slot_free(started: Dict[str, int], ended: Dict[str, int],
                                     slots: int) -> float:
    """The longest time (s) between the first and the last start during which fewer than
    ``slots`` bodies ran: with a backlog, a slot freed and not handed over at once."""
    events = sorted([(us, 1) for us in started.values()] + [(us, -1) for us in ended.values()])
    last_start = max(started.values())
    running, free_since, longest = 0, None, 0.0
    for us, change in events:
        if us > last_start:
            break
        running += change
        if running < slots and free_since is None:
            free_since = us
        elif running >= slots and free_since is not None:
            longest, free_since = max(longest, (us - free_since) / 1e6), None
    return longest


def test_backlog_keeps_both_slots_busy(cluster: WorkerCluster) -> None:
    """30 tasks of 0.2 s on 2 slots: no slot waits for a countdown (a run that is not
    handed a slot comes back after 2.5 s or more); every freed slot goes to a waiter as
    soon as its message travels, however loaded the machine is. (The benchmark measures
    the utilisation itself.)"""
    task = cluster.app.tasks[HANDOFF_PATIENT]
    results = [task.delay(0.2) for _ in range(30)]
    wait_for_results(cluster, results)

    record = record_store(cluster)
    assert_each_ran_once(record, results)
    assert max(peaks(record, HANDOFF_PATIENT_KEY)) == 2
    started, ended = times(cluster, "started"), times(cluster, "ended")
    stretch = longest_stretch_with_a_slot_free(started, ended, 2)
    assert stretch < PATIENT_BACKOFF / 2, f"a slot stood free for {stretch:.2f} s"
    assert_slots_all_given_back(cluster, [HANDOFF_PATIENT_KEY])
    # The line is empty; only served tickets are remembered, and they expire.
    lock = lock_store(cluster)
    keys = line_keys(HANDOFF_PATIENT_KEY)
    assert lock.zcard(keys["q"]) == 0
    served = {field.decode() for field in lock.hkeys(keys["w"])}
    assert all(field.startswith("d:") for field in served)  # which copy ran, per ticket
    assert len(served) == lock.zcard(keys["x"])
    assert lock.pttl(keys["x"]) > 0 and lock.pttl(keys["w"]) > 0


@dataclass
class LineEvents:
    """What the lock store did with a semaphore's waiting line, in the server's order."""

    #: The task ids of the waiters, in the order of the line: by when they first asked
    #: (server ms), as the line sorts them (``ZADD <line> NX <ms> <ticket>``).
    joined: List[Tuple[int, str, str]] = field(default_factory=list)
    #: The task ids of the waiters, in the order they were served a slot: handed a
    #: reserved one (``ZADD <semaphore> <end> ~<ticket>``) or, at the front of the line,
    #: admitted on their own (``HSET <line> d:<ticket>``); each once.
    served: List[str] = field(default_factory=list)

    def line(self) -> List[str]:
        return [task_id for _, _, task_id in sorted(self.joined)]

    def note(self, words: List[str]) -> None:
        command = words[0].upper()
        if command == "ZADD" and len(words) == 5 and words[2] == "NX" and ":q:" in words[1]:
            if all(ticket != words[4] for _, ticket, _ in self.joined):  # NX: first only
                self.joined.append((int(words[3]), words[4], words[4].split(".")[0]))
            return
        ticket = words[3][1:] if command == "ZADD" and words[3].startswith("~") else \
            words[2][2:] if command == "HSET" and words[2].startswith("d:") else None
        task_id = ticket and ticket.split(".")[0]
        if task_id and task_id not in self.served:
            self.served.append(task_id)


@contextmanager
def line_events(cluster: WorkerCluster) -> Iterator[LineEvents]:
    """The :class:`LineEvents` of the block, read with MONITOR: the order the server ran
    the scripts in, not the order loaded worker processes got round to the task bodies."""
    events = LineEvents()
    with lua_commands(cluster) as commands:
        yield events
    for words in commands:
        if len(words) >= 4:
            events.note(words)


def test_waiters_start_in_the_order_they_asked(cluster: WorkerCluster) -> None:
    """A slot is held by hand while tasks arrive one by one; once it is given back, the
    waiters are served slots in exactly the order they first asked (each one that asked
    joined the line). Judged by the order the lock store handed the slots over, which
    holds however late a loaded worker starts the body it was handed."""
    lock = lock_store(cluster)
    held = hold_by_hand(cluster, HANDOFF_SLEEP, 2)
    task = cluster.app.tasks[HANDOFF_SLEEP]
    keys = line_keys(HANDOFF_SLEEP)
    results = []
    for number in range(8):
        results.append(task.delay(0.05))
        wait_until(lambda n=number + 1: lock.zcard(keys["q"]) == n, 10, f"waiter {number}")
    with line_events(cluster) as events:
        release_by_hand(cluster, held)
        wait_for_results(cluster, results)
    assert_each_ran_once(record_store(cluster), results)
    assert events.served == [result.id for result in results]
    assert max(peaks(record_store(cluster), HANDOFF_KEY)) <= 2


def test_hand_off_lost_with_its_releaser_still_runs_every_task(
        cluster: WorkerCluster) -> None:
    """A holder that frees its slot and dies before re-publishing the waiter's message:
    the reservation lapses, and the waiter's own copy, back on its countdown, runs the
    task, once."""
    lock = lock_store(cluster)
    held = hold_by_hand(cluster, HANDOFF_SLEEP, 2)
    task = cluster.app.tasks[HANDOFF_SLEEP]
    keys = line_keys(HANDOFF_SLEEP)
    results = [task.delay(0.05) for _ in range(3)]
    wait_until(lambda: lock.zcard(keys["q"]) == 3, 10, "three waiters in line")
    release_by_hand(cluster, held, reserve_ms=300, publish_handoffs=False)  # short: quick
    assert [len(lease.handoffs) for lease in held] == [1, 1]  # handed over, never published
    wait_for_results(cluster, results)
    assert_each_ran_once(record_store(cluster), results)
    assert max(peaks(record_store(cluster), HANDOFF_KEY)) <= 2


def test_waits_are_short_and_fair_under_a_burst(cluster: WorkerCluster) -> None:
    """20 runs sent at once on 2 slots: the runs that had to wait are served slots in
    exactly the order they first asked (the lock store's order, which holds however late
    a loaded worker gets round to a body; the order they were sent in only decides when
    a worker first asks), every waiter is served through the line, and no slot waits for
    a countdown."""
    task = cluster.app.tasks[HANDOFF_PATIENT]
    with line_events(cluster) as events:
        results = [task.delay(0.1) for _ in range(20)]
        wait_for_results(cluster, results)
    assert_each_ran_once(record_store(cluster), results)
    assert events.joined, "no run had to wait"
    assert events.served == events.line()
    started, ended = times(cluster, "started"), times(cluster, "ended")
    stretch = longest_stretch_with_a_slot_free(started, ended, 2)
    assert stretch < PATIENT_BACKOFF / 2, f"a slot stood free for {stretch:.2f} s"


def test_served_run_killed_mid_body_runs_again_once(cluster: WorkerCluster) -> None:
    """A waiter is handed the slot, and its process is SIGKILLed in the body; with
    acks_late and reject_on_worker_lost the broker redelivers that message, which runs
    again (as Celery would without the package) as soon as the worker's main process has
    freed the lost run's slot (Celery sends no task_failure for a requeued message: the
    task's request class does it), not a whole 30 s lease later. Its other copy, back on
    its countdown (at most 0.6 s), finds the ticket served and does not run it a third
    time."""
    lock = lock_store(cluster)
    name = "crash-once"
    [held] = hold_by_hand(cluster, name, 1)
    result = cluster.app.tasks[HANDOFF_CRASH_ONCE].delay()
    keys = line_keys(name)
    wait_until(lambda: lock.zcard(keys["q"]) == 1, 10, "the task in line")
    release_by_hand(cluster, [held], publish_handoffs=False)
    assert publish(cluster.app, held.handoffs) == 1
    assert result.get(timeout=15) == result.id  # Celery notices a lost child within ~5 s
    record = record_store(cluster)
    assert record.get(f"crashes:{result.id}") == "2"
    # The countdown copy comes back within 0.6 s (plus delivery) and must end unrun.
    with pytest.raises(AssertionError):
        wait_until(lambda: record.get(f"runs:{result.id}") != "2", 3, "a third run")
    assert record.get(f"runs:{result.id}") == "2"


def test_waiting_runs_hold_no_pool_process(cluster: WorkerCluster) -> None:
    """30 runs wait in line (more than the 9 pool processes) while the slots are held by
    hand; plain tasks sent after them still run at once, because a waiting run is a
    message in the broker, not a process blocked on a lock."""
    lock = lock_store(cluster)
    held = hold_by_hand(cluster, HANDOFF_SLEEP, 2)
    waiting = [cluster.app.tasks[HANDOFF_SLEEP].delay(0.05) for _ in range(30)]
    keys = line_keys(HANDOFF_SLEEP)
    wait_until(lambda: lock.zcard(keys["q"]) == 30, 20, "thirty runs in line")
    echoes = [cluster.app.tasks[PLAIN_ECHO].delay(number) for number in range(20)]
    assert [echo.get(timeout=5) for echo in echoes] == list(range(20))
    assert not any(result.ready() for result in waiting)
    release_by_hand(cluster, held)
    wait_for_results(cluster, waiting)
    assert_each_ran_once(record_store(cluster), waiting)
