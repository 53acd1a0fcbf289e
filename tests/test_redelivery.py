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
from redelivery_app import KEY, LIMITED, TRACKED, create_app

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow

BODY_SECONDS = 2.0


@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory) -> WorkerCluster:
    """Two worker processes of the redelivery app, two prefork children each."""
    return worker_cluster_factory(workers=2, concurrency=2, app_module="redelivery_app",
                                  app_factory=create_app)


def settled(cluster: WorkerCluster, key: str = KEY) -> bool:
    """No message waits in the broker or in a worker, and no slot of ``key`` is held."""
    assert cluster.urls is not None
    broker = redis.Redis.from_url(cluster.urls.broker)
    return (broker.hlen("unacked") == 0 and broker.llen("celery") == 0
            and Semaphore(lock_store(cluster), key).holders() == 0)


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
    # Refused, a redelivered copy parks at the end of the line (the parking script
    # answers a refusal with a park, never a send-back): none follows the earlier run.
    logs = cluster.logs()
    assert "] parked: " in logs
    assert "it follows that run" not in logs


def started(record, ids: List[str]) -> List[str]:
    return [task_id for task_id in ids if record.hexists("started", task_id)]


def test_a_wait_is_not_a_run(cluster: WorkerCluster) -> None:
    """Five tasks behind one slot, with STARTED tracked: each waited, yet Celery saw one
    run of each: task_prerun and task_postrun once, and the state still PENDING when the
    run began (a wait stored STARTED before). (Busy pools and rate limits: test_gate.)"""
    record = record_store(cluster)
    ids = [cluster.app.send_task(TRACKED, (0.3,)).id for _ in range(5)]
    # task_postrun's record is written after the slot is given back: wait for it too.
    wait_until(lambda: len(record.hkeys("ended")) == 5 and record.hlen("postrun") == 5
               and settled(cluster, "tracked"), 60, "five runs")
    assert runs_of(record, ids) == dict.fromkeys(ids, 1)
    assert record.hgetall("prerun") == dict.fromkeys(ids, "1")
    assert record.hgetall("postrun") == dict.fromkeys(ids, "1")
    assert record.hgetall("prerun-state") == dict.fromkeys(ids, "PENDING")
    assert max(int(n) for n in record.lrange("peaks:tracked", 0, -1)) == 1


def test_revoke_terminate_stops_a_run_that_waited(cluster: WorkerCluster) -> None:
    """Five tasks of 3 s behind one slot; each, once its body runs (all but the first
    waited), is revoked with terminate=True: every one stops before its body ends,
    task_revoked fires once for each, and the next one gets the slot."""
    record = record_store(cluster)
    ids = [cluster.app.send_task(TRACKED, (3.0,)).id for _ in range(5)]
    for count in range(1, 6):
        wait_until(lambda count=count: len(started(record, ids)) >= count, 60,
                   f"run {count} to start")
        running = [task_id for task_id in started(record, ids)
                   if task_id not in record.hkeys("revoked")]
        assert len(running) == 1, running
        cluster.app.control.revoke(running[0], terminate=True)
        wait_until(lambda task_id=running[0]: record.hget("revoked", task_id) is not None,
                   20, "task_revoked")
    wait_until(lambda: settled(cluster, "tracked"), 30, "the slot to come back")
    # The body's own finally may record its end as the signal stops it: well short
    # of its 3 s.
    begun, ended = record.hgetall("started"), record.hgetall("ended")
    assert all(int(ended[task_id]) - int(begun[task_id]) < 2_500_000
               for task_id in ended), (begun, ended)
    assert record.hgetall("revoked") == dict.fromkeys(ids, "1")
    assert runs_of(record, ids) == dict.fromkeys(ids, 1)
