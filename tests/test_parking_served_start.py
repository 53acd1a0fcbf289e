"""End to end, default acks: a run moved out of parking has its reference served as its
body starts, by a request its pool process writes before the body and does not wait for
(``engine.parking.started_soon``): the mark is in the lock store while the body runs, so
that a copy of the run given back later (its worker killed mid-body, the claim lapsed)
ends unrun, as Celery alone, which acknowledged the message at the start, never runs it
again.

Real ``celery worker`` processes (prefork, :mod:`parking_app`) on a private redis-server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from test_parking_line import run_counts

from celery_redislock.engine.admission import ParkRef, Served, SlotLimit
from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.engine.parking import park_admit, run_id

from cluster_checks import lock_store, peaks, record_store, wait_for_results, wait_until
from parking_app import GATE_ENV, ONE, ONE_PREFIX

if TYPE_CHECKING:
    from worker_cluster import WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 30.0


@pytest.mark.parametrize("gate", ["async", "blocking"])
def test_a_moved_run_is_served_while_its_body_runs(start_workers: WorkerClusterFactory,
                                                   gate: str) -> None:
    cluster = start_workers("parking_app", {GATE_ENV: gate}, workers=1, concurrency=2)
    record, lock = record_store(cluster), lock_store(cluster)
    one = cluster.app.tasks[ONE]
    name = ONE_PREFIX + "served"
    holder = one.delay(0.5, key="served")
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    run = one.delay(5.0, key="served")
    wait_until(lambda: record.hexists("started", run.id), TIMEOUT, "the moved run's body")
    assert int(record.hget("refused", run.id) or 0) >= 1  # it was parked, then moved
    key = semaphore_key(name, "redislock:")
    refs = companion_key(key, "pr")
    wait_until(lambda: (lock.hget(refs, run_id(run.id, 0)) or b"").startswith(b"s"), 3.0,
               "its reference served")  # "s", or "s <since> <copy>": the copy's id kept
    assert record.hexists(f"running:{name}", run.id)  # its body still runs
    # A copy of the run given back now (any park id) ends unrun.
    copy: Any = park_admit(lock, [SlotLimit(name, 1, "redislock:")], lease=5,
                           run=run_id(run.id, 0), parked=ParkRef(key, "0:1"))
    assert isinstance(copy, Served)
    wait_for_results(cluster, [holder, run])
    assert run_counts(record, [holder, run]) == [1, 1]
    assert max(peaks(record, name)) == 1
