"""Fair hand-off while the lock store goes away: no task lost, none run twice.

The lock store is a Redis server of its own (append-only, fsync always: it comes back
with its data), apart from the broker, so it can be stopped while tasks wait in line
and hand-offs are under way (see :mod:`soak_app`, whose app this test uses).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

import soak_app
from cluster_checks import assert_each_ran_once, peaks, record_store, wait_for_results, wait_until
from redis_process import RedisServer

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow


@pytest.fixture
def lock_server():
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    yield server.start()
    server.cleanup()


def test_lock_store_down_mid_hand_off(worker_cluster_factory: WorkerClusterFactory,
                                      lock_server: RedisServer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """20 runs of one key (1 slot, 0.1 s each); the lock store stops for a second while
    they hand the slot down the line, then comes back. Every task runs exactly once and
    never two at once."""
    monkeypatch.setenv(soak_app.LOCK_URL_ENV, lock_server.url)
    cluster: WorkerCluster = worker_cluster_factory(
        workers=3, concurrency=3, app_module="soak_app", app_factory=soak_app.create_app)
    key = 0  # soak:0 has one slot
    task = cluster.app.tasks[soak_app.TASK_FOR_SLOTS[soak_app.slots_of_key(key)]]
    results = [task.delay(key, 0.1) for _ in range(20)]
    record = record_store(cluster)
    wait_until(lambda: len(peaks(record, f"soak:{key}")) >= 5, 30, "five runs")
    lock_server.stop()
    time.sleep(1.0)  # the outage itself, not a wait for something to happen
    lock_server.start()
    wait_for_results(cluster, results)
    assert_each_ran_once(record, results)
    assert max(peaks(record, f"soak:{key}")) == 1
