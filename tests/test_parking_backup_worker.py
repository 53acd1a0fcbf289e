"""End to end: a moved copy lost in kombu's pop window (found by the history check,
seed 2 with AOF). kombu's Redis transport takes a message off its queue with ``BRPOP``
and only then records it as unacknowledged: a worker killed in between loses it. Celery
alone meets that window once per message; a parked run met it a second time with its
moved copy, and was lost (its reservation lapsed 10 s later, and no copy was left).
Now the move keeps a backup in the broker until a worker receives the copy, and the
workers' polls put an unclaimed one back at the front of its parking queue, where the
slot handed over again when the reservation lapses moves it.

Real ``celery worker`` processes (:mod:`parking_app`) on private redis-servers. The
dying consumer is the test itself: worker1, which the run was sent to and which parked
it, is SIGKILLed; the release moves the copy back to worker1's own queue, which no one
consumes now, and the test pops it and drops it, as worker1 would have died with it.
Then worker1 starts again, and the run must run exactly once. In the second test the
dropped copy comes back late, after its message was put back: two copies of the run
then exist, and exactly one of them runs.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Tuple

import pytest
import redis
from celery.utils.nodenames import worker_direct
from test_parking_line import _broker, _nodes

from celery_redislock.parking import REGISTRY
from celery_redislock.parking.naming import MOVED_PREFIX, MOVING

from cluster_checks import peaks, record_store, wait_for_results, wait_until
from parking_app import GATE_ENV, LINE_ENV, ONE, ONE_PREFIX

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 40.0


@pytest.fixture(params=["blocking", "async"])
def cluster(request: pytest.FixtureRequest,
            start_workers: WorkerClusterFactory) -> WorkerCluster:
    """Two prefork workers of :mod:`parking_app` on the parking line, under each gate."""
    return start_workers("parking_app", {LINE_ENV: "broker", GATE_ENV: request.param},
                         concurrency=1)


def test_a_moved_copy_lost_in_the_pop_window_still_runs_once(cluster: WorkerCluster) -> None:
    record = record_store(cluster)
    victim, _, queue = _lose_a_moved_copy(cluster, "popped")
    lost_at = time.monotonic()
    cluster.restart_worker("worker1")
    wait_until(lambda: record.exists(f"runs:{victim}"), TIMEOUT, "the lost copy's run")
    print(f"\nthe run ran {time.monotonic() - lost_at:.1f} s after its moved copy was lost")
    _settle(cluster, "popped", queue)
    assert int(record.get(f"runs:{victim}") or 0) == 1
    assert max(peaks(record, ONE_PREFIX + "popped")) == 1


def test_a_moved_copy_late_after_its_message_was_put_back_runs_once(
        cluster: WorkerCluster) -> None:
    """The moved copy reaches a worker after its backup was put back in the parking
    queue (it waited in its queue too long): one of the two copies runs."""
    record, broker = record_store(cluster), _broker(cluster)
    victim, copy, queue = _lose_a_moved_copy(cluster, "late")
    wait_until(lambda: broker.llen(queue) == 1, TIMEOUT, "the message to be put back")
    broker.rpush(str(json.loads(copy)["properties"]["delivery_info"]["routing_key"])
                 + ".dq2", copy)  # and now the late copy arrives, in worker1's queue
    cluster.restart_worker("worker1")
    wait_until(lambda: record.exists(f"runs:{victim}"), TIMEOUT, "a copy's run")
    _settle(cluster, "late", queue)
    assert int(record.get(f"runs:{victim}") or 0) == 1
    assert max(peaks(record, ONE_PREFIX + "late")) == 1


def _lose_a_moved_copy(cluster: WorkerCluster, key: str) -> Tuple[str, bytes, str]:
    """A run of ``key`` parked by worker1, worker1 killed, the run's copy moved back to
    worker1's queue and popped here: (its task id, the copy, its parking queue)."""
    record, broker = record_store(cluster), _broker(cluster)
    task, nodes = cluster.app.tasks[ONE], _nodes(cluster)
    holder = task.apply_async((TIMEOUT,), {"key": key, "until": key},
                              queue=worker_direct(nodes["worker2"]))
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    victim = task.apply_async((0.05,), {"key": key}, queue=worker_direct(nodes["worker1"]))
    wait_until(lambda: _parked(broker), TIMEOUT, "the run to park")
    queue = _parked(broker)
    worker1 = cluster.worker("worker1")
    worker1.kill()
    wait_until(lambda: worker1.returncode is not None, TIMEOUT, "worker1 to die")
    record.rpush(f"go:{key}", "1")  # its release moves the parked copy to worker1's queue
    popped = broker.brpop([worker_direct(nodes["worker1"]).name], timeout=TIMEOUT)
    assert popped is not None, "the moved copy never came"
    assert json.loads(popped[1])["headers"]["id"] == victim.id  # and now it is gone
    wait_until(lambda: record.hexists("ended", holder.id), TIMEOUT, "the holder's end")
    return victim.id, popped[1], queue


def _settle(cluster: WorkerCluster, key: str, queue: str) -> None:
    """Until a later run of ``key`` ran and nothing of the line is left in the broker."""
    broker = _broker(cluster)
    marker = cluster.app.tasks[ONE].apply_async(
        (0.01,), {"key": key}, queue=worker_direct(_nodes(cluster)["worker1"]))
    wait_for_results(cluster, [marker])
    wait_until(lambda: _settled(broker, queue), TIMEOUT, "no backup or parked copy left")


def _parked(broker: redis.Redis) -> str:
    """The parking queue that holds a message ("" while none does)."""
    for queue in broker.hkeys(REGISTRY):
        if broker.llen(queue):
            return queue.decode()
    return ""


def _settled(broker: redis.Redis, queue: str) -> bool:
    return (broker.zcard(MOVING) == 0 and not broker.keys(MOVED_PREFIX + "*")
            and broker.llen(queue) == 0)
