"""End to end: LimitedTask limits hold across several real prefork Celery workers.

Each test starts three ``celery worker`` processes of three pool children each (see
:mod:`worker_cluster`) on a private Redis server, sends tasks of :mod:`worker_app`, and
checks what the task bodies recorded in the record store: how many ran at once per limit
key, and that every task ran exactly once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Dict, List

import pytest
from celery import chain
from celery.result import AsyncResult

from cluster_checks import (
    assert_each_ran_once,
    assert_no_lease_lost,
    assert_slots_all_given_back,
    holders,
    peaks,
    record_store,
    server_time_us,
    store_commands,
    wait_for_results,
    wait_until,
)
from worker_app import (
    CHAIN_KEY,
    CHAIN_STEP,
    CUSTOMERS_KEY,
    HAND_ON_ENV,
    LIMITED_KEY,
    LIMITED_SLEEP,
    QUIET_KEY,
    QUIET_SLEEP,
    SHORT_LEASE_KEY,
    SHORT_LEASE_SLEEP,
    SYNC_CUSTOMER,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

#: The harness is a plugin (imported by pytest, so that its asserts are rewritten).

pytestmark = pytest.mark.slow

@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory) -> WorkerCluster:
    """Three worker processes with three prefork children each."""
    return worker_cluster_factory(workers=3, concurrency=3)


def test_slots_bound_concurrency_across_all_workers(cluster: WorkerCluster) -> None:
    """30 tasks with lock_slots=2 on 9 pool processes: exactly 2 at once at the peak."""
    task = cluster.app.tasks[LIMITED_SLEEP]
    results = [task.delay(0.2) for _ in range(30)]

    values = wait_for_results(cluster, results)

    record = record_store(cluster)
    assert sorted(values) == sorted(result.id for result in results)
    assert_each_ran_once(record, results)
    seen = peaks(record, LIMITED_KEY)
    assert len(seen) == 30
    assert max(seen) == 2, f"concurrency per start: {seen}"
    assert record.get(f"running:{LIMITED_KEY}") == "0"
    assert_slots_all_given_back(cluster, [LIMITED_SLEEP])
    assert_no_lease_lost(cluster)


def test_releases_left_for_the_next_request_all_reach_the_lock_store(
        cluster: WorkerCluster) -> None:
    """40 runs that store no result on a never-full semaphore: each release goes with
    its process's next request to the lock store, and the last one of each process,
    with no next request, within moments; every run runs once, every slot comes back."""
    task = cluster.app.tasks[QUIET_SLEEP]
    sent = [task.delay(0.05) for _ in range(40)]
    record = record_store(cluster)

    wait_until(lambda: all(record.get(f"runs:{result.id}") for result in sent), timeout=60,
               what="every run to start")
    wait_until(lambda: record.get(f"running:{QUIET_KEY}") == "0", timeout=10,
               what="every run to end")
    wait_until(lambda: holders(cluster, QUIET_KEY) == 0, timeout=5,
               what="every slot to come back")

    assert_each_ran_once(record, sent)
    seen = peaks(record, QUIET_KEY)
    assert len(seen) == 40
    assert max(seen) <= 9, f"concurrency per start: {seen}"
    assert_no_lease_lost(cluster)


@pytest.mark.parametrize("hand_on", [False, True], ids=["hand-on-off", "hand-on"])
def test_the_main_process_takes_and_gives_back_each_slot_in_one_script_call(
        worker_cluster_factory: WorkerClusterFactory, monkeypatch: pytest.MonkeyPatch,
        hand_on: bool) -> None:
    """A slot the worker's main process takes for a run goes with the request to a pool
    process, which runs under it as it stands (no adoption), and the main process gives
    it back with its next admission once the pool reports the run's end: one script
    call per run (the admission), the release riding with the next one as two plain
    commands. Every run runs once, every slot comes back.

    With ``redislock_hand_on`` off, every run is admitted by the lock store: one script
    call per run, at least 40. With it on (the default), a slot handed on to the next run
    waiting in the worker (see :mod:`celery_redislock.gate.hand_on` and
    ``test_hand_on``) costs neither an admission nor a release: at most one per run."""
    if not hand_on:
        monkeypatch.setenv(HAND_ON_ENV, "0")
    cluster = worker_cluster_factory(workers=3, concurrency=3)
    task = cluster.app.tasks[QUIET_SLEEP]
    record = record_store(cluster)
    with store_commands(cluster) as commands:
        sent = [task.delay(0.05) for _ in range(40)]
        wait_until(lambda: all(record.get(f"runs:{result.id}") for result in sent),
                   timeout=60, what="every run to start")
        wait_until(lambda: record.get(f"running:{QUIET_KEY}") == "0", timeout=10,
                   what="every run to end")
        wait_until(lambda: holders(cluster, QUIET_KEY) == 0, timeout=5,
                   what="every slot to come back")

    assert_each_ran_once(record, sent)
    scripts = sum(1 for words in commands if words and words[0].upper() == "EVALSHA")
    # 40 admissions (fewer with hand-on: slots handed on in the workers); a few more for
    # probes of runs that waited for a pool process and for the workers' registrations
    # (adopting each lease in its pool process made 80).
    least = 1 if hand_on else 40
    assert least <= scripts <= 50, f"{scripts} script calls for 40 runs"
    assert_no_lease_lost(cluster)


def test_a_chained_step_that_finds_the_slot_taken_is_handed_it(
        cluster: WorkerCluster) -> None:
    """The steps of a chain store results, and each step's release goes with its
    process's next request to the lock store, or from its lease keeper within about
    10 ms. The first step also takes the key's other slot, so the second step, in
    whatever worker it lands, finds the semaphore full if it asks before that release;
    it then joins the line and the release hands it the slot: it starts within a second
    of the first step's end (measured: 17-24 ms, against 9-15 ms from the second step to
    the third, which finds its slot free), not after its 5 s countdown. Every step runs
    once."""
    step = cluster.app.tasks[CHAIN_STEP]
    result = chain(step.s([], True), step.s(), step.s()).delay()
    ids = result.get(timeout=30)
    record = record_store(cluster)
    assert len(ids) == 3 and all(record.get(f"runs:{task_id}") == "1" for task_id in ids)
    started = {task_id: int(record.hget("started", task_id)) for task_id in ids}
    ended = {task_id: int(record.hget("ended", task_id)) for task_id in ids}
    gaps = [started[later] - ended[earlier] for earlier, later in zip(ids, ids[1:])]
    assert max(gaps) < 1_000_000, f"gaps between steps (us): {gaps}"
    assert max(peaks(record, CHAIN_KEY)) == 1
    wait_until(lambda: holders(cluster, CHAIN_KEY) == 0, timeout=5,
               what="every slot to come back")


def test_per_key_limit_with_positional_and_keyword_calls(cluster: WorkerCluster) -> None:
    """lock_key="customer:{customer_id}": one at a time per customer, however the
    argument is passed, while different customers run side by side."""
    task = cluster.app.tasks[SYNC_CUSTOMER]
    calls: List[Callable[[int], AsyncResult]] = [
        lambda customer: task.delay(customer),
        lambda customer: task.delay(customer_id=customer),
        lambda customer: task.delay(customer, seconds=0.3),
        lambda customer: task.apply_async(kwargs={"customer_id": customer, "seconds": 0.3}),
    ]
    customers = [1, 2, 3]
    results: Dict[int, List[AsyncResult]] = {customer: [] for customer in customers}
    for call in calls:
        for customer in customers:
            results[customer].append(call(customer))
    every = [result for batch in results.values() for result in batch]

    values = wait_for_results(cluster, every)

    record = record_store(cluster)
    assert values == [customer for customer in customers for _ in calls]
    assert_each_ran_once(record, every)
    for customer in customers:
        seen = peaks(record, f"customer:{customer}")
        assert seen == [1] * len(calls), f"customer {customer}: concurrency per start {seen}"
    across = peaks(record, CUSTOMERS_KEY)
    assert len(across) == len(every)
    assert max(across) > 1, f"customers never ran side by side: {across}"
    assert_slots_all_given_back(cluster, [f"customer:{customer}" for customer in customers])
    assert_no_lease_lost(cluster)


def test_lease_is_renewed_while_a_long_task_runs(cluster: WorkerCluster) -> None:
    """A task on a 1 s lease that runs 3 s keeps its only slot all along: a second task
    of the same key starts only after the first ended."""
    task = cluster.app.tasks[SHORT_LEASE_SLEEP]
    record = record_store(cluster)
    first = task.delay(3.0)
    wait_until(lambda: record.hexists("started", first.id), 30, "the first task to start")
    first_started = int(record.hget("started", first.id))
    second = task.delay(0.1)

    # Past twice the lease, the first still holds the slot and the second still waits.
    wait_until(lambda: server_time_us(record) >= first_started + 2_500_000, 10,
               "2.5 s into the first task")
    assert not record.hexists("ended", first.id), "the first task ended too soon"
    assert not record.hexists("started", second.id), "the second task did not wait"
    assert holders(cluster, SHORT_LEASE_SLEEP) == 1

    assert wait_for_results(cluster, [first, second]) == [first.id, second.id]
    times = {
        name: {result.id: int(record.hget(name, result.id)) for result in (first, second)}
        for name in ("started", "ended")
    }
    assert times["ended"][first.id] - times["started"][first.id] >= 3_000_000
    assert times["started"][second.id] >= times["ended"][first.id]
    assert peaks(record, SHORT_LEASE_KEY) == [1, 1]
    assert_each_ran_once(record, [first, second])
    assert re.search(rf"\[{second.id}\] (deferred: it found the only slot of|parked: the "
                     "slots of .* are taken)", cluster.logs()), (
        "the second task never found the slot taken"
    )
    assert_slots_all_given_back(cluster, [SHORT_LEASE_SLEEP])
    assert_no_lease_lost(cluster)
