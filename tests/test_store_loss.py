"""End to end: a lock store that loses its data does not admit runs beside live holders.

The lock store (a Redis server of its own here, so that the broker keeps its messages)
is SIGKILLed while two runs hold both slots of a key and started again, empty, on the
same port; more runs of the key are sent at once. The holders' keepers re-assert their
leases, and no new slot is granted until the longest lease of the app's tasks has
passed (a holder on that long a lease may still re-assert), so no more than 2 bodies
ever run at once (counted from inside the bodies, see :mod:`fault_app`). Times are on
the record store's clock; ``pytest -s`` prints them.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, List

import pytest
import redis
from celery.result import AsyncResult

from celery_redislock.engine.admission import Busy, SlotLimit, admit

from cluster_checks import (
    assert_each_ran_once,
    lock_store,
    peaks,
    record_store,
    server_time_us,
    slots_come_back,
    wait_until,
)
from fault_app import (
    HOLD,
    HOLD_PREFIX,
    LONG_LEASE,
    PAIR,
    PAIR_LEASE,
    PAIR_PREFIX,
    PAIR_SLOTS,
    create_app,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

#: Longest wait for anything the test waits for.
TIMEOUT = 60.0

#: How long the first holders run: well past a lease after the lock store came back.
HOLD_SECONDS = 3 * PAIR_LEASE


def started(record, results: List[AsyncResult]) -> List[int]:
    return [int(record.hget("started", result.id)) for result in results]


def restart_lock_store_empty(cluster: WorkerCluster) -> None:
    """SIGKILL the lock store's server and start it again, empty, on the same port."""
    server = cluster.lock_redis
    assert server is not None and server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.start()


def test_lock_store_restarted_empty_under_live_holders(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    cluster = worker_cluster_factory(workers=2, concurrency=3, app_module="fault_app",
                                     app_factory=create_app, separate_lock_store=True)
    record = record_store(cluster)
    pair = cluster.app.tasks[PAIR]
    key = PAIR_PREFIX + "loss"
    first = [pair.delay(HOLD_SECONDS, key="loss") for _ in range(PAIR_SLOTS)]
    wait_until(lambda: all(record.hexists("started", r.id) for r in first), TIMEOUT,
               "the first holders to start")

    restart_lock_store_empty(cluster)
    back_at = server_time_us(record)
    assert lock_store(cluster).dbsize() == 0
    more = [pair.delay(0.3, key="loss") for _ in range(6)]

    results = first + more
    assert [r.get(timeout=TIMEOUT + LONG_LEASE) for r in results] == [r.id for r in results]
    assert max(peaks(record, key)) <= PAIR_SLOTS, f"peaks: {peaks(record, key)}"
    assert_each_ran_once(record, results)
    next_start = (min(started(record, more)) - back_at) / 1e6
    first_end = (min(int(record.hget("ended", r.id)) for r in first) - back_at) / 1e6
    print(f"\nlock store restarted empty: next start {next_start:.3f} s after it was back; "
          f"the first holders ended {first_end:.3f} s after")
    # The holders kept their slots: re-asserted, not lost.
    assert [record.hget("lost", r.id) for r in first] == ["0"] * PAIR_SLOTS
    assert slots_come_back(cluster, key)


def test_lock_store_flushed_grants_afresh_after_one_lease(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    """One run holds one of the two slots when the lock store is flushed: the free slot is
    granted again only once the longest lease of the app's tasks (30 s) has passed (the
    holders of before had that long to re-assert theirs), and then beside the holder,
    which kept its slot."""
    cluster = worker_cluster_factory(workers=2, concurrency=2, app_module="fault_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    pair = cluster.app.tasks[PAIR]
    key = PAIR_PREFIX + "grace"
    holder = pair.delay(LONG_LEASE + HOLD_SECONDS, key="grace")
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")

    flushed_at = server_time_us(record)
    lock_store(cluster).flushdb()
    newcomer = pair.delay(0.3, key="grace")
    assert newcomer.get(timeout=TIMEOUT + LONG_LEASE) == newcomer.id
    waited = (started(record, [newcomer])[0] - flushed_at) / 1e6
    print(f"\nlock store flushed under 1 of 2 holders: next start {waited:.3f} s after")
    assert waited >= LONG_LEASE * 0.99, "a slot granted afresh before the longest lease"
    assert not record.hexists("ended", holder.id), "the holder ended first: nothing shown"
    assert holder.get(timeout=TIMEOUT + LONG_LEASE + HOLD_SECONDS) == holder.id
    assert peaks(record, key) == [1, 2]
    assert record.hget("lost", holder.id) == "0"
    assert slots_come_back(cluster, key)


def test_the_grace_after_an_empty_restart_covers_the_longest_lease(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    """The first call after the lock store restarted empty comes from a process whose
    only limit has a short lease (this test's), while a run of the worker holds a slot
    on a 30 s lease, renewed every 10 s. A run of that key asks a few seconds later,
    long past the short lease: it is refused until the holder has re-asserted, since its
    worker declares its longest lease (issue 27: the grace was the first caller's lease,
    and the newcomer ran beside the holder)."""
    cluster = worker_cluster_factory(workers=1, concurrency=2, app_module="fault_app",
                                     app_factory=create_app, separate_lock_store=True)
    record = record_store(cluster)
    hold = cluster.app.tasks[HOLD]
    key = HOLD_PREFIX + "grace"
    short_lived = lock_store(cluster)
    short_limit = [SlotLimit("short-lived", 1, "redislock:")]
    assert admit(short_lived, short_limit, lease=0.5).release()  # it has seen the store
    holder = hold.delay(LONG_LEASE * 2 / 3, key="grace")
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")

    restart_lock_store_empty(cluster)
    back_at = server_time_us(record)
    try:
        first = admit(short_lived, short_limit, lease=0.5)
    except redis.ConnectionError:  # its connection of before the restart
        first = admit(short_lived, short_limit, lease=0.5)
    assert isinstance(first, Busy)  # the loss is seen: a grace begins
    newcomer = hold.delay(0.2, key="grace")  # its worker asks once it may (seconds on)

    assert newcomer.get(timeout=TIMEOUT + LONG_LEASE) == newcomer.id
    assert holder.get(timeout=TIMEOUT) == holder.id
    waited = (started(record, [newcomer])[0] - back_at) / 1e6
    print(f"\nlock store restarted empty: the newcomer started {waited:.3f} s after")
    assert peaks(record, key) == [1, 1], f"peaks: {peaks(record, key)}"
    assert record.hget("lost", holder.id) == "0"  # re-asserted, not lost
    assert slots_come_back(cluster, key)
