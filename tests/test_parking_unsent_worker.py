"""End to end: a gevent worker killed between a refusal and its parked copy's publish
(found by the history check, gevent, seed 1 with AOF). Under default acks Celery
acknowledged the message when the greenlet took it: the run is lost with its worker, as
Celery alone loses a run whose worker dies. What the lock store keeps of it must not
outlive it: its reference lapses (no longer counted as waiting, then forgotten once no
copy of it can come back: ``lua/parked_unsent.lua``), and the key space's index of parked
lines, which named its line, forgets it, or lapses itself. Before the fix the reference
waited for the 7 days the line's keys live, and the index had no time to live.

Real ``celery worker`` processes (gevent, :mod:`parking_app`) on a private
redis-server; the kill is injected where it matters (``REDISLOCK_TEST_KILL_BEFORE_PUBLISH``:
the greenlet about to publish SIGKILLs its whole worker).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from celery.utils.nodenames import worker_direct
from test_parking_line import _nodes

from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.engine.parked_view import read_parked_lines
from celery_redislock.engine.parking import parked_index, run_id

from cluster_checks import lock_store, record_store, wait_until
from parking_app import (
    KILL_BEFORE_PUBLISH_ENV,
    KILL_BEFORE_PUBLISH_SET,
    LINE_ENV,
    ONE,
    ONE_PREFIX,
    UNSENT_ENV,
    VISIBILITY_ENV,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 30.0


@pytest.fixture
def cluster(start_workers: WorkerClusterFactory) -> WorkerCluster:
    """Two gevent workers of :mod:`parking_app` on the parking line, the kill hook on, a
    bound of 1 s for a copy's publish to be confirmed, and a visibility timeout (how long
    a served or lapsed reference is kept) of 3 s."""
    pytest.importorskip("gevent")
    return start_workers("parking_app", {LINE_ENV: "broker", KILL_BEFORE_PUBLISH_ENV: "1",
                                         UNSENT_ENV: "1000", VISIBILITY_ENV: "3"},
                         concurrency=2, pool="gevent")


def test_a_worker_killed_before_its_parked_copy_leaves_no_reference(
        cluster: WorkerCluster) -> None:
    record, lock = record_store(cluster), lock_store(cluster)
    task, nodes = cluster.app.tasks[ONE], _nodes(cluster)
    key = semaphore_key(ONE_PREFIX + "unsent", "redislock:")
    refs = companion_key(key, "pr")
    holder = task.apply_async((2.0,), {"key": "unsent"}, queue=worker_direct(nodes["worker2"]))
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    victim = str(uuid.uuid4())
    record.sadd(KILL_BEFORE_PUBLISH_SET, victim)
    task.apply_async((0.05,), {"key": "unsent"}, task_id=victim,
                     queue=worker_direct(nodes["worker1"]))
    wait_until(lambda: cluster.worker("worker1").returncode is not None, TIMEOUT,
               "worker1 to be killed before its publish")
    assert record.hexists("killed-before-publish", victim)
    assert (lock.hget(refs, run_id(victim, 0)) or b"").startswith(b"w ")  # its reference

    def lapsed() -> bool:
        seconds, micros = lock.time()
        line = read_parked_lines(lock, [key], seconds * 1000 + micros // 1000).get(key)
        index = parked_index("redislock:")
        return ((line is None or line.references_waiting == 0)
                and (lock.zscore(index, key) is None or lock.ttl(index) > 0))

    # worker2's poll (every ~0.1-0.25 s) lapses it once 1 s passed unconfirmed: it is no
    # longer counted, and is to be forgotten once no copy of it can come back (the keep
    # of a served reference: here 63 s, from the visibility timeout; see
    # test_parking_unsent.py for the forgetting itself).
    wait_until(lapsed, TIMEOUT, "the dead run's reference to lapse")
    forget = lock.zrange(companion_key(key, "pu"), 0, -1, withscores=True)
    assert [member for member, _ in forget] == [
        b"!" + lock.hget(refs, run_id(victim, 0)).split()[2] + b" " + run_id(victim, 0).encode()]
    seconds, _ = lock.time()
    assert 50 < forget[0][1] / 1000 - seconds <= 64
    after = task.apply_async((0.05,), {"key": "unsent"}, queue=worker_direct(nodes["worker2"]))
    wait_until(lambda: holder.ready() and after.ready(), TIMEOUT, "the live runs")
    assert [holder.status, after.status] == ["SUCCESS", "SUCCESS"]
    assert int(record.get(f"runs:{victim}") or 0) == 0  # lost with its worker (Celery's)
