"""End to end on the parking line (``redislock_line = "broker"``), real workers of
:mod:`parity_app`: what used to keep runs on today's line (a ``lock_max_wait``, a
``lock_cost`` above 1, pools without an event loop) now parks."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, List

import pytest
from celery.result import AsyncResult
from parity_app import HEAVY, MAX_WAIT, POOL_ASKS_ENV, UNITS, WAITS

from cluster_checks import assert_failed_on_time, line_polls, peaks, record_store, wait_until
from parking_app import LINE_ENV, ONE, ONE_PREFIX

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 30.0


@pytest.fixture
def start_cluster(start_workers: WorkerClusterFactory) -> WorkerClusterFactory:
    """Start workers of :mod:`parity_app` on the parking line."""

    def start(pool_asks: bool = False, **options: Any) -> WorkerCluster:
        return start_workers("parity_app", {LINE_ENV: "broker",
                                            **({POOL_ASKS_ENV: "1"} if pool_asks else {})},
                             **options)

    return start


def ready(cluster: WorkerCluster, results: List[AsyncResult]) -> Callable[[], bool]:
    def done() -> bool:
        cluster.check_running()
        return all(result.ready() for result in results)
    return done


#: The pause between two sends of the max-wait test (s; a workload's shape, not a wait
#: for anything): twenty runs due in the same poll are moved back one after another by
#: one mover, and the last one's hop back is then twenty moves long, which the test's
#: bound (one hop, as a send's) does not count (seen once in CI at load ~15: 0.08 s over).
SPREAD = 0.05


def test_max_wait_fails_parked_runs_on_time_with_the_line_long(start_cluster: Any) -> None:
    """One slot held until every waiter failed, 20 runs parked behind it (sent over about
    a second): each fails with LockWaitTimeout within about a poll of its deadline, none
    runs, the holder ends.
    Each waiter is judged from its own send (its deadline counts from its first refusal,
    after that) to its failure as the worker stored it: sending 20 runs on a loaded
    machine takes a while, so the first ones are due before the last ones are sent. (A
    holder that held the slot for a fixed time would hand it to a waiter still parked
    when it ended, on a machine slow enough: that waiter would run.)"""
    cluster = start_cluster()
    record = record_store(cluster)
    task = cluster.app.tasks[WAITS]
    holder = task.delay(TIMEOUT * 2, key="mw", until="mw")
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder's start")
    waiters, sent = [], []
    with line_polls(cluster) as polls:
        for _ in range(20):  # over ~1 s: a poll owes a few deadline moves, not twenty
            sent.append(time.time())  # the host's clock, as the worker's result date
            waiters.append(task.delay(0.05, key="mw"))
            time.sleep(SPREAD)
        wait_until(ready(cluster, waiters), TIMEOUT, "the waiters' failures", interval=0.02)
    assert_failed_on_time(waiters, sent, MAX_WAIT, polls)
    assert [int(record.get(f"runs:{r.id}") or 0) for r in waiters] == [0] * len(waiters)
    assert not holder.ready()  # it held the slot all along
    record.rpush("go:mw", 1)
    wait_until(ready(cluster, [holder]), TIMEOUT, "the holder's end")
    assert holder.status == "SUCCESS"
    logs = cluster.logs()
    assert " parked: " in logs and "cannot park its runs" not in logs


def test_cost_two_runs_under_three_units_never_exceed_three(start_cluster: Any) -> None:
    """Runs of cost 2 under 3 units, 6 pool processes, 14 runs: never more than 3 units
    held at once (counted from inside the bodies), each run once, all parked on the
    broker line."""
    cluster = start_cluster()
    record = record_store(cluster)
    results = [cluster.app.tasks[HEAVY].delay(0.15) for _ in range(14)]
    wait_until(ready(cluster, results), TIMEOUT, "the heavy runs")
    assert [r.status for r in results] == ["SUCCESS"] * len(results)
    held = [int(n) for n in record.lrange("unit_peaks", 0, -1)]
    print(f"\nunits held as each body started: {held}")
    assert len(held) == len(results) and max(held) <= UNITS
    assert [int(record.get(f"runs:{r.id}") or 0) for r in results] == [1] * len(results)
    logs = cluster.logs()
    assert " parked: " in logs and "cannot park its runs" not in logs


@pytest.mark.parametrize("how", ["gevent", "pool asks"])
def test_runs_decided_where_they_run_park_and_run_once(start_cluster: Any, how: str) -> None:
    """A gevent worker (no event loop: each run asks in its greenlet), and prefork with
    ``redislock_admit_before_pool = False`` (the pool process asks): refused runs park
    from there, on the process's own mover; one slot, each run once, never two at once."""
    if how == "gevent":
        pytest.importorskip("gevent")
        cluster = start_cluster(workers=2, concurrency=4, pool="gevent")
    else:
        cluster = start_cluster(pool_asks=True)
    record = record_store(cluster)
    task = cluster.app.tasks[ONE]
    results = [task.delay(0.1, key=how.replace(" ", "-")) for _ in range(12)]
    wait_until(ready(cluster, results), TIMEOUT, "the runs")
    assert [r.status for r in results] == ["SUCCESS"] * len(results)
    assert max(peaks(record, ONE_PREFIX + how.replace(" ", "-"))) == 1
    assert [int(record.get(f"runs:{r.id}") or 0) for r in results] == [1] * len(results)
    logs = cluster.logs()
    assert " parked: " in logs and "cannot park its runs" not in logs
    assert " deferred: " not in logs
