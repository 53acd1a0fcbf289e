"""End to end: two workers with the same node name never free each other's live slots.

Celery lets two ``celery worker`` processes run under one node name (it only warns), as
two workers started without ``-n`` on one host do (both ``celery@host``). A worker frees
what its own previous life left at start, and what it still holds at exit: neither may
touch the slots of a live namesake. The peak is recorded from inside the task bodies
(see :mod:`fault_app`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from celery_redislock import Semaphore

from cluster_checks import (
    assert_each_ran_once,
    holders,
    lock_store,
    peaks,
    record_store,
    slots_come_back,
    wait_until,
)
from fault_app import PAIR, PAIR_PREFIX, PAIR_SLOTS, create_app

if TYPE_CHECKING:
    from worker_cluster import WorkerClusterFactory

pytestmark = pytest.mark.slow

#: Longest wait for anything the test waits for.
TIMEOUT = 60.0

#: How long the first holders run: past a namesake's start, exit and restart.
HOLD_SECONDS = 20.0


def test_namesake_started_stopped_and_restarted_beside_live_holders(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    """worker1 holds both slots of a 2-slot key; a second worker with worker1's node name
    starts, shuts down (warm) and starts again while more runs of the key wait: the live
    slots stay held throughout, and no more than 2 bodies ever run at once."""
    cluster = worker_cluster_factory(workers=1, concurrency=2, app_module="fault_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    pair = cluster.app.tasks[PAIR]
    key = PAIR_PREFIX + "twin"
    first = [pair.delay(HOLD_SECONDS, key="twin") for _ in range(PAIR_SLOTS)]
    wait_until(lambda: all(record.hexists("started", r.id) for r in first), TIMEOUT,
               "the first holders to start")
    assert holders(cluster, key) == PAIR_SLOTS

    twin = cluster.add_namesake("worker1-twin", of="worker1")
    assert holders(cluster, key) == PAIR_SLOTS, "the namesake freed live slots at start"

    waiters = [pair.delay(0.3, key="twin") for _ in range(4)]
    # worker1 may keep two of them in its prefetch buffer: the namesake gets the others.
    wait_until(lambda: any(record.hexists("refused", r.id) for r in waiters), TIMEOUT,
               "a waiter to be refused")

    twin.terminate()
    assert twin.wait(time.monotonic() + TIMEOUT), "the namesake did not shut down"
    assert holders(cluster, key) == PAIR_SLOTS, "the namesake freed live slots at exit"

    cluster.start_process_and_wait(twin)
    assert holders(cluster, key) == PAIR_SLOTS, "the restarted namesake freed live slots"
    assert not any(record.hexists("ended", r.id) for r in first), "held too short a time"

    results = first + waiters
    assert [r.get(timeout=TIMEOUT + HOLD_SECONDS) for r in results] == [r.id for r in results]
    assert max(peaks(record, key)) <= PAIR_SLOTS, f"peaks: {peaks(record, key)}"
    assert_each_ran_once(record, results)
    assert slots_come_back(cluster, key)
    assert "LEASE LOST" not in cluster.logs()


def test_killed_worker_restarted_frees_only_its_dead_life_beside_a_live_namesake(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    """worker1 holds both slots of key A and is SIGKILLed whole; its namesake holds a slot
    of key B meanwhile; worker1 restarted frees the two slots its dead life left (its
    registration names a process that is gone) and leaves the live namesake's alone."""
    cluster = worker_cluster_factory(workers=1, concurrency=2, app_module="fault_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    pair = cluster.app.tasks[PAIR]
    dead = [pair.delay(HOLD_SECONDS, key="dead") for _ in range(PAIR_SLOTS)]
    wait_until(lambda: all(record.hexists("started", r.id) for r in dead), TIMEOUT,
               "worker1's runs to start")
    twin = cluster.add_namesake("worker1-twin", of="worker1")
    cluster.worker("worker1").kill()
    live = pair.delay(HOLD_SECONDS, key="live")  # only the namesake consumes now
    wait_until(lambda: record.hexists("started", live.id), TIMEOUT, "the namesake's run")
    live_members = lock_store(cluster).zrange(Semaphore(lock_store(cluster),
                                                        PAIR_PREFIX + "live").key, 0, -1)
    assert holders(cluster, PAIR_PREFIX + "dead") == PAIR_SLOTS

    cluster.start_process_and_wait(cluster.worker("worker1"))
    wait_until(lambda: holders(cluster, PAIR_PREFIX + "dead") == 0, TIMEOUT,
               "the restarted worker to free its dead life's slots")
    assert "freed 2 slot(s) still held by a previous run of" in \
        cluster.worker("worker1").log_text()
    assert lock_store(cluster).zrange(Semaphore(lock_store(cluster),
                                                PAIR_PREFIX + "live").key, 0, -1) \
        == live_members
    assert not record.hexists("ended", live.id) and twin.returncode is None
    assert live.get(timeout=TIMEOUT + HOLD_SECONDS) == live.id
    assert record.hget("lost", live.id) == "0"
