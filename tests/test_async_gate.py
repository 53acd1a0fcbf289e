"""End to end: ``redislock_gate = "async"`` (the default), admissions sent from the
worker's main process on a connection its event loop drives (see
:mod:`celery_redislock.gate.hub_store`), with real prefork workers of
:mod:`gate_app`.

The limits hold across two workers, a refused run waits and then runs exactly once, a
lock store that stops answering (its ``redis-server`` stopped with SIGSTOP) stalls
nothing else on the worker, and the runs it held back proceed once it answers again.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any, Iterator, List

import pytest
import redis

from celery_redislock import Semaphore

from cluster_checks import lock_store, peaks, record_store, wait_until
from gate_app import GATE_ENV, PLAIN, SLOTTED, SLOTTED_KEY, THREE, THREE_KEY, create_app

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

#: What a worker says once when its main process asks without blocking.
DRIVEN = "asks the lock store without blocking"


@pytest.fixture
def async_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Workers started in this test run ``redislock_gate = "async"``."""
    monkeypatch.setenv(GATE_ENV, "async")
    yield


def settled(cluster: WorkerCluster) -> bool:
    """No message waits in the broker or in a worker, and no slot is held."""
    assert cluster.urls is not None
    broker = redis.Redis.from_url(cluster.urls.broker)
    return (broker.hlen("unacked") == 0 and broker.llen("celery") == 0
            and Semaphore(lock_store(cluster), SLOTTED_KEY).holders() == 0)


def ran_once(record: Any, ids: List[str]) -> bool:
    """Every body of ``ids`` ended, each once (a body that ran twice shows as "2")."""
    return all(record.hexists("ended", task_id) for task_id in ids)


def assert_each_once(record: Any, ids: List[str]) -> None:
    assert {task_id: record.get(f"runs:{task_id}") for task_id in ids} == dict.fromkeys(
        ids, "1")


def test_the_limit_holds_across_two_workers_and_each_run_is_run_once(
        worker_cluster_factory: WorkerClusterFactory, async_gate: None) -> None:
    """Two workers of three processes, twelve runs behind one slot: most are refused at
    first and wait (sent back, handed the slot later); the bodies never overlap, and
    each runs once."""
    cluster = worker_cluster_factory(workers=2, concurrency=3, app_module="gate_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    ids = [cluster.app.send_task(SLOTTED, (0.1,)).id for _ in range(12)]
    wait_until(lambda: ran_once(record, ids) and settled(cluster), 90, "twelve runs")
    assert_each_once(record, ids)
    assert max(peaks(record, SLOTTED_KEY)) == 1
    assert DRIVEN in cluster.logs()


def test_runs_asked_for_ahead_keep_the_limit_and_give_the_last_slot_back(
        worker_cluster_factory: WorkerClusterFactory, async_gate: None) -> None:
    """Two workers of two processes, a key of three slots: each worker asks for runs
    ahead of its free processes while the key has slots to spare, and gives back a slot
    so taken that was the last; never more than three bodies at once, each run once,
    every slot given back."""
    cluster = worker_cluster_factory(workers=2, concurrency=2, app_module="gate_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    ids = [cluster.app.send_task(THREE, (0.05,)).id for _ in range(30)]
    wait_until(lambda: ran_once(record, ids) and settled(cluster)
               and Semaphore(lock_store(cluster), THREE_KEY).holders() == 0, 120,
               "thirty runs")
    assert_each_once(record, ids)
    assert max(peaks(record, THREE_KEY)) <= 3
    assert "was not handled" not in cluster.logs()


def test_a_store_that_stops_answering_stalls_nothing_else(
        worker_cluster_factory: WorkerClusterFactory, async_gate: None) -> None:
    """The lock store's server is stopped (SIGSTOP) as three runs behind one slot
    arrive: their admissions wait on the event loop without holding it, so a plain task
    sent after them runs while the store is still stopped. The asks fail after their
    deadline (1 s) and the runs are sent back to wait, fail-closed; once the store runs
    again, each runs once, one at a time."""
    cluster = worker_cluster_factory(workers=1, concurrency=2, app_module="gate_app",
                                     app_factory=create_app, separate_lock_store=True)
    record = record_store(cluster)
    first = cluster.app.send_task(SLOTTED, (0,)).id  # the worker's connections are made
    wait_until(lambda: ran_once(record, [first]) and settled(cluster), 30, "a first run")
    assert cluster.lock_redis is not None and cluster.lock_redis.process is not None
    store_pid = cluster.lock_redis.process.pid
    os.kill(store_pid, signal.SIGSTOP)
    try:
        ids = [cluster.app.send_task(SLOTTED, (0.1,)).id for _ in range(3)]
        plain = cluster.app.send_task(PLAIN, (0,)).id
        wait_until(lambda: record.hexists("ended", plain), 30,
                   "the plain task, with the lock store stopped")
        wait_until(lambda: "could not reach the lock store" in cluster.logs(), 30,
                   "the asks in flight to fail at their deadline")
        assert not any(record.hexists("started", task_id) for task_id in ids)
    finally:
        os.kill(store_pid, signal.SIGCONT)
    wait_until(lambda: ran_once(record, ids) and settled(cluster), 60,
               "the three runs, once the store answers")
    assert_each_once(record, [first, *ids, plain])
    assert max(peaks(record, SLOTTED_KEY)) == 1


def test_a_pool_without_the_loop_asks_blocking_and_says_so_once(
        worker_cluster_factory: WorkerClusterFactory, async_gate: None) -> None:
    """The threads pool reports runs' ends from its threads: its worker asks blocking,
    says so once in its log, and the limit holds as ever."""
    cluster = worker_cluster_factory(workers=1, concurrency=3, app_module="gate_app",
                                     app_factory=create_app, pool="threads")
    record = record_store(cluster)
    ids = [cluster.app.send_task(SLOTTED, (0.05,)).id for _ in range(6)]
    wait_until(lambda: ran_once(record, ids) and settled(cluster), 60, "six runs")
    assert_each_once(record, ids)
    assert max(peaks(record, SLOTTED_KEY)) == 1
    logs = cluster.logs()
    assert logs.count("this worker asks the lock store blocking") == 1
    assert DRIVEN not in logs
