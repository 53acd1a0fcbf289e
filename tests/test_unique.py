"""Unique tasks at enqueue (``lock_unique``), end to end with real prefork workers.

One cluster of two ``celery worker`` processes (two pool children each) serves the module;
task bodies record their runs in the record store (see :mod:`features_app`).
"""

from __future__ import annotations

import threading
import time
from typing import Iterator, List

import pytest
from celery.result import AsyncResult

from celery_redislock import AlreadyQueued

import features_app
from cluster_checks import record_store, wait_for_results, wait_until
from features_app import (
    PLAIN_UNIQUE,
    PLAIN_UNIQUE_LIMITED,
    UNIQUE_RAISE,
    UNIQUE_RETRY,
    UNIQUE_SINGLETON,
    UNIQUE_SLEEP,
)
from worker_cluster import WorkerCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path_factory.mktemp("unique-workers"), app_module="features_app",
                       app_factory=features_app.create_app, workers=2,
                       concurrency=2) as started:
        yield started


def _send_at_once(send, senders: int = 20) -> List[AsyncResult]:
    """``send()`` from ``senders`` threads released together."""
    barrier = threading.Barrier(senders)
    results: List[AsyncResult] = []
    guard = threading.Lock()

    def one() -> None:
        barrier.wait()
        result = send()
        with guard:
            results.append(result)

    threads = [threading.Thread(target=one) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == senders
    return results


def _runs(record, prefix: str = "runs:") -> int:
    return sum(int(record.get(key) or 0) for key in record.scan_iter(f"{prefix}*"))


def test_twenty_concurrent_senders_enqueue_one_run(cluster: WorkerCluster) -> None:
    """20 threads send the same job at once: every one gets the same AsyncResult, one body
    runs; once it has ended, a new send enqueues (and runs) a new task."""
    task = cluster.app.tasks[UNIQUE_SLEEP]
    record = record_store(cluster)

    # The body lasts 3 s, far longer than 20 sends take even on a loaded machine.
    results = _send_at_once(lambda: task.delay("same", 3.0))

    ids = {result.id for result in results}
    assert len(ids) == 1, ids
    wait_for_results(cluster, results[:1])
    assert record.get(f"runs:{results[0].id}") == "1"
    assert record.llen("peaks:job:same") == 1

    again = task.delay("same", 0.05)
    assert again.id not in ids
    wait_for_results(cluster, [again])
    assert record.llen("peaks:job:same") == 2


def test_other_keys_are_not_deduplicated(cluster: WorkerCluster) -> None:
    task = cluster.app.tasks[UNIQUE_SLEEP]
    results = [task.delay(f"k{i}", 0.05) for i in range(4)]
    assert len({result.id for result in results}) == 4
    wait_for_results(cluster, results)


def test_raise_mode_names_key_and_existing_task(cluster: WorkerCluster) -> None:
    task = cluster.app.tasks[UNIQUE_RAISE]
    first = task.delay("r1", 2.0)
    with pytest.raises(AlreadyQueued) as raised:
        task.apply_async(("r1",), {"seconds": 0.1})
    assert raised.value.key == "job:r1"
    assert raised.value.task_id == first.id
    assert "job:r1" in str(raised.value) and first.id in str(raised.value)
    wait_for_results(cluster, [first])
    wait_for_results(cluster, [task.delay("r1", 0.01)])  # free again once it ended


def test_self_retry_keeps_the_lock_and_is_not_refused_by_it(cluster: WorkerCluster) -> None:
    """The body retries itself once with a 1 s countdown: the retry's re-send passes its own
    lock, the lock stays taken meanwhile (a new send gets the same result), and the task
    succeeds on its second attempt."""
    task = cluster.app.tasks[UNIQUE_RETRY]
    record = record_store(cluster)
    first = task.delay("x")
    wait_until(lambda: record.get(f"attempts:{first.id}") == "1", 20, "the first attempt")
    assert task.delay("x").id == first.id  # still queued, for its retry
    assert wait_for_results(cluster, [first]) == [1]
    assert record.get(f"attempts:{first.id}") == "2"
    assert record.get(f"runs:{first.id}") == "1"
    assert task.delay("x").id != first.id


def test_plain_task_unique_through_the_setting(cluster: WorkerCluster) -> None:
    task = cluster.app.tasks[PLAIN_UNIQUE]
    results = _send_at_once(lambda: task.delay("p", 2.0), senders=8)
    assert len({result.id for result in results}) == 1
    wait_for_results(cluster, results[:1])
    assert record_store(cluster).llen("peaks:plain:p") == 1


def test_singleton_task_with_lock_unique(cluster: WorkerCluster) -> None:
    task = cluster.app.tasks[UNIQUE_SINGLETON]
    results = _send_at_once(lambda: task.delay(2.0), senders=6)
    assert len({result.id for result in results}) == 1
    wait_for_results(cluster, results[:1])


def test_unique_while_queued_limited_while_running(cluster: WorkerCluster) -> None:
    """Unique per job, one run at a time across jobs: 3 jobs sent 4 times each give 3
    tasks, which run one after another."""
    task = cluster.app.tasks[PLAIN_UNIQUE_LIMITED]
    results = [task.delay(job, 1.0) for _ in range(4) for job in "abc"]
    distinct = {result.id: result for result in results}
    assert len(distinct) == 3
    wait_for_results(cluster, list(distinct.values()))
    record = record_store(cluster)
    assert max(int(v) for v in record.lrange("peaks:unique-limited", 0, -1)) == 1
    assert [record.llen(f"peaks:ul:{job}") for job in "abc"] == [1, 1, 1]


def test_send_task_by_name_is_not_deduplicated(cluster: WorkerCluster) -> None:
    """A sender without the task's class cannot compute its key: send_task is not
    deduplicated (README says so), and both runs go ahead."""
    first = cluster.app.send_task(UNIQUE_SLEEP, ("by-name", 0.3))
    second = cluster.app.send_task(UNIQUE_SLEEP, ("by-name", 0.3))
    assert first.id != second.id
    wait_for_results(cluster, [first, second])


def test_killed_worker_does_not_block_the_key_past_the_lease(cluster: WorkerCluster) -> None:
    """The worker running a unique task (run lease 2 s) is SIGKILLed: within the lease
    (plus polling) a new send of the same job is enqueued again, and runs."""
    task = cluster.app.tasks[UNIQUE_SLEEP]
    record = record_store(cluster)
    first = task.delay("killed", 60)
    wait_until(lambda: record.get(f"host:{first.id}"), 20, "the long run to start")
    victim = record.get(f"host:{first.id}").split("@", 1)[0]
    cluster.worker(victim).kill()
    killed_at = time.monotonic()
    assert task.delay("killed", 0.01).id == first.id  # still held, by its lease

    def free() -> bool:
        return task.delay("killed", 0.01).id != first.id

    wait_until(free, 15, "the dead run's lock to run out", interval=0.1)
    freed_after = time.monotonic() - killed_at
    print(f"\nunique lock of a killed worker's run free after {freed_after:.2f} s (lease 2 s)")
    assert freed_after < 2 + 3
    cluster.restart_worker(victim)


def test_revoked_queued_task_frees_its_key(cluster: WorkerCluster) -> None:
    """A unique task revoked while it waits (here: on its countdown) gives its key back
    when a worker drops it, instead of holding it for the queue lease."""
    task = cluster.app.tasks[UNIQUE_SLEEP]
    first = task.apply_async(("revoked", 0.01), countdown=3)
    assert task.delay("revoked", 0.01).id == first.id
    first.revoke()
    wait_until(lambda: task.delay("revoked", 0.01).id != first.id, 15,
               "the revoked task's key to be free", interval=0.1)
