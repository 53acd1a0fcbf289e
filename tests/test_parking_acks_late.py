"""End to end, ``acks_late`` on the parking line: a moved copy's served mark names the copy
that ran (``lua/parked_admit.lua``'s ``rerun_ref``).

Found by the history check: the release of an ``acks_late`` run moved out of parking
marked its reference served; its worker killed whole after that and before Celery
stored the result and acknowledged the message, the broker gave the message back and
the copy ended unrun as served: the task stayed PENDING, where Celery alone runs it
again. The copy that ran now runs again; another copy of the run (two copies of one
move) still ends unrun.

Real ``celery worker`` processes (prefork, :mod:`parking_app`) on a private redis-server.
A run stops after its release, in its pool process, until the test lets it go or kills
its worker (``REDISLOCK_TEST_HOLD_AFTER_RELEASE``).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, Tuple

import pytest
import redis
from celery.utils.nodenames import worker_direct
from test_parking_line import _broker, _give_back_unacknowledged, _nodes

from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.engine.parking import run_id

from cluster_checks import lock_store, peaks, record_store, wait_for_results, wait_until
from parking_app import HOLD_ENV, HOLD_SET, LATE, LATE_PREFIX, VISIBILITY_ENV

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 30.0


@pytest.fixture
def cluster(start_workers: WorkerClusterFactory) -> WorkerCluster:
    """Two workers of :mod:`parking_app` on the parking line, the hold hook on."""
    return start_workers("parking_app", {HOLD_ENV: "1", VISIBILITY_ENV: "3"}, concurrency=2)


def moved_and_held(cluster: WorkerCluster, key: str) -> Tuple[Any, Any, bytes]:
    """An ``acks_late`` run parked behind a holder on worker2, moved out of parking when
    the holder ends, run on worker1 and held there after its release, which served its
    reference: ``(holder's result, run's result, its served reference)``."""
    record, lock = record_store(cluster), lock_store(cluster)
    task, nodes = cluster.app.tasks[LATE], _nodes(cluster)
    holder = task.apply_async((1.0,), {"key": key}, queue=worker_direct(nodes["worker2"]))
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    run_id_ = uuid.uuid4().hex
    record.sadd(HOLD_SET, run_id_)
    run = task.apply_async((0.05,), {"key": key}, task_id=run_id_,
                           queue=worker_direct(nodes["worker1"]))
    wait_until(lambda: record.hexists("held", run.id), TIMEOUT, "the run to be held")
    assert int(record.hget("refused", run.id) or 0) >= 1  # it was parked, then moved
    refs = companion_key(semaphore_key(LATE_PREFIX + key, "redislock:"), "pr")
    served: Dict[str, bytes] = {}

    def is_served() -> bool:  # the release is sent within about 10 ms of the body's end
        served["ref"] = lock.hget(refs, run_id(run.id, 0)) or b""
        return served["ref"].startswith(b"s")

    wait_until(is_served, TIMEOUT, "its reference to be served")
    return holder, run, served["ref"]


def test_a_run_killed_after_its_release_runs_again(cluster: WorkerCluster) -> None:
    """Worker1 is killed whole (main process and pool) after the release of a moved
    ``acks_late`` run and before its acknowledgement: the broker gives the message
    back, and the copy runs again and succeeds, as Celery alone runs it."""
    record, broker = record_store(cluster), _broker(cluster)
    holder, run, _ = moved_and_held(cluster, "kill")
    cluster.worker("worker1").kill()
    cluster.restart_worker("worker1")
    _give_back_unacknowledged(cluster, broker)
    wait_for_results(cluster, [holder, run])
    assert int(record.get(f"runs:{run.id}")) == 2  # the killed body's, and the re-run
    assert max(peaks(record, LATE_PREFIX + "kill")) == 1


def test_another_copy_of_a_moved_run_ends_unrun(cluster: WorkerCluster) -> None:
    """A second copy of a moved ``acks_late`` run (what a move cut between its publish
    and its ack leaves on RabbitMQ: its id another) is delivered once the run's release
    served its reference: it ends unrun, and the run runs once."""
    record, broker = record_store(cluster), _broker(cluster)
    holder, run, _ = moved_and_held(cluster, "copy")
    queue = worker_direct(_nodes(cluster)["worker2"]).name
    broker.lpush(queue, _second_copy(broker, run.id))
    wait_until(_only_held(broker, queue), TIMEOUT, "the second copy to be taken and ended")
    record.rpush(f"go:{run.id}", "go")
    wait_for_results(cluster, [holder, run])
    assert int(record.get(f"runs:{run.id}")) == 1


def _second_copy(broker: redis.Redis, task_id: str) -> str:
    """Another copy of the delivered message of ``task_id`` (kombu's Redis payload, in
    the broker's hash of unacknowledged deliveries), its move id another."""
    for raw in broker.hvals("unacked"):
        payload = json.loads(raw)[0]
        if payload["headers"].get("id") == task_id:
            payload["headers"]["redislock_wait"]["move"] = "another"
            payload["properties"]["delivery_tag"] = str(uuid.uuid4())
            return json.dumps(payload)
    raise AssertionError(f"no unacknowledged delivery of {task_id}")


def _only_held(broker: redis.Redis, queue: str) -> Callable[[], bool]:
    """The second copy left its queue, and the held run's is the one delivery left
    unacknowledged (the second copy's was acknowledged: it ended unrun)."""
    return lambda: broker.llen(queue) == 0 and broker.hlen("unacked") == 1
