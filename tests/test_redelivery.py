"""End to end: redelivered messages (acks_late, bodies longer than the broker's
visibility timeout) and what Celery's own signals see of a limited run.

The workers run :mod:`redelivery_app`: a one-second visibility timeout, kombu looking for
unacknowledged messages every second, task bodies of two seconds, one slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List

import pytest
import redis

from celery_redislock import Semaphore

from cluster_checks import lock_store, record_store, wait_until
from redelivery_app import KEY, LIMITED, create_app

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow

BODY_SECONDS = 2.0


@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory) -> WorkerCluster:
    """Two worker processes of the redelivery app, two prefork children each."""
    return worker_cluster_factory(workers=2, concurrency=2, app_module="redelivery_app",
                                  app_factory=create_app)


def settled(cluster: WorkerCluster) -> bool:
    """No message waits in the broker or in a worker, and no slot is held."""
    assert cluster.urls is not None
    broker = redis.Redis.from_url(cluster.urls.broker)
    return (broker.hlen("unacked") == 0 and broker.llen("celery") == 0
            and Semaphore(lock_store(cluster), KEY).holders() == 0)


def runs_of(record, ids: List[str]) -> Dict[str, int]:
    return {task_id: int(record.get(f"runs:{task_id}") or 0) for task_id in ids}


def test_redelivery_does_not_starve_the_line(cluster: WorkerCluster) -> None:
    """Four tasks of 2 s behind one slot, each delivered again while it runs: every task
    runs, none more than twice (Celery alone runs each of them 2 to 4 times here: the
    redelivered copy runs beside the first), and the last one starts within a bounded
    time (before the fix one task ran again and again and the others never ran)."""
    record = record_store(cluster)
    sent_us = int(record.time()[0]) * 1_000_000 + int(record.time()[1])
    ids = [cluster.app.send_task(LIMITED, (BODY_SECONDS,)).id for _ in range(4)]

    def all_ran() -> bool:
        cluster.check_running()
        return all(record.hexists("ended", task_id) for task_id in ids)

    wait_until(all_ran, 60, "every task to run once", interval=0.1)
    # Copies of the messages still in flight (redelivered, following) settle.
    wait_until(lambda: settled(cluster), 30, "every message to be acknowledged")
    runs = runs_of(record, ids)
    assert all(1 <= count <= 2 for count in runs.values()), runs
    assert max(int(n) for n in record.lrange(f"peaks:{KEY}", 0, -1)) == 1
    starts = [int(record.hget("started", task_id)) for task_id in ids]
    # Four bodies of 2 s one after the other: the last starts after about 6 s; allow
    # for a loaded machine, but not for a line that starves.
    assert max(starts) - sent_us < 40_000_000
    assert "it follows that run" in cluster.logs()
