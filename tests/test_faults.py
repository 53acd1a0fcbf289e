"""End to end: slots come back quickly after faults, and limits hold through them.

Each test starts real prefork workers of :mod:`fault_app` (see :mod:`worker_cluster`),
breaks something while a task holds a slot on a 30 s lease, and checks from the record
store that no two bodies of one key ever ran at once (``peaks``, counted over live
processes only, see :mod:`fault_app`) and how soon the slot was free again: far sooner
than the lease, since the package frees the slots of runs it knows are dead.

Every measured time is on the Redis server's clock; :data:`MEASURED` collects them per
fault for the summary printed at the end of the module (``pytest -s``).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List

import pytest
import redis
from celery.result import AsyncResult
from celery.utils.nodenames import worker_direct

from celery_redislock import Semaphore

from cluster_checks import (
    holders,
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
    SHORT_LEASE,
    SHORT_PREFIX,
    SLOW_REPORT_SECONDS,
    SLOW_REPORTED,
    TIME_LIMIT,
    TIME_LIMITED,
    create_app,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow

#: A slot freed by the package must be back well within this (the lease is 30 s).
QUICK = 5.0

#: Celery notices that a pool child died at its next ``maintain_pool`` tick (every 5 s,
#: ``AsynPool.timers``), then reports ``WorkerLostError``: a SIGKILLed child's slot comes
#: back within that tick, plus a little.
LOST_CHILD_NOTICED = 5.0 + 1.0

#: Longest wait for anything a test waits for.
TIMEOUT = 40.0

#: Seconds from each fault to its slot being free again, per fault (for the summary).
MEASURED: Dict[str, List[float]] = defaultdict(list)


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield
    for fault, seconds in MEASURED.items():
        print(f"\n{fault}: " + ", ".join(f"{value:.3f} s" for value in seconds))


def start_cluster(factory: WorkerClusterFactory, workers: int, concurrency: int
                  ) -> WorkerCluster:
    return factory(workers=workers, concurrency=concurrency, app_module="fault_app",
                   app_factory=create_app)


# ----- reading the record store -----

def started_us(record: redis.Redis, result: AsyncResult) -> int:
    return int(record.hget("started", result.id))


def ended_us(record: redis.Redis, result: AsyncResult) -> int:
    return int(record.hget("ended", result.id))


def wait_started(record: redis.Redis, result: AsyncResult, what: str,
                 timeout: float = TIMEOUT) -> int:
    wait_until(lambda: record.hexists("started", result.id), timeout, f"{what} to start")
    return started_us(record, result)


def wait_refused(record: redis.Redis, result: AsyncResult, what: str) -> None:
    """Until ``result``'s run has found the slot taken at least once (it waits for it)."""
    wait_until(lambda: record.hexists("refused", result.id), TIMEOUT, f"{what} to be refused")


def wait_state(result: AsyncResult, state: str, what: str) -> None:
    wait_until(lambda: result.state == state, TIMEOUT, f"{what} to be {state}", interval=0.05)


def seconds_between(earlier_us: int, later_us: int) -> float:
    return (later_us - earlier_us) / 1_000_000


def assert_ran_once(record: redis.Redis, *results: AsyncResult) -> None:
    runs = {result.id: record.get(f"runs:{result.id}") for result in results}
    assert runs == {result.id: "1" for result in results}


def assert_countdowns_short(cluster: WorkerCluster) -> None:
    """No re-queued run waited as long as half the broker's visibility_timeout. On the
    parking line (the default) a refused run parks, with no countdown."""
    ceiling = cluster.app.conf.broker_transport_options["visibility_timeout"] / 2
    logs = cluster.logs()
    countdowns = [float(value) for value in re.findall(r"; waiting ([0-9.]+) s \(attempt",
                                                       logs)]
    assert countdowns or "] parked: " in logs, "no run was ever re-queued or parked"
    assert max(countdowns, default=0.0) < ceiling


def lock_key(cluster: WorkerCluster, name: str) -> str:
    """The Redis key of semaphore ``name`` in the lock store."""
    return Semaphore(lock_store(cluster), name).key


def lease_end_us(cluster: WorkerCluster, name: str) -> int:
    """When the leases now held in semaphore ``name`` run out unless renewed (server
    clock, µs): a slot that comes back before then was freed, not left to expire."""
    entries = lock_store(cluster).zrange(lock_key(cluster, name), 0, -1, withscores=True)
    ends = [score for member, score in entries if member[:1] not in (b"#", b"~")]
    assert ends, f"nobody holds {name}"
    return int(max(ends)) * 1000


def node_names(cluster: WorkerCluster) -> Dict[str, str]:
    """Worker name (``worker1``) -> full node name (``worker1@host``), from a ping."""
    replies = cluster.app.control.ping(timeout=1.0) or []
    nodes = {node.split("@", 1)[0]: node for reply in replies for node in reply}
    assert set(cluster.names) <= set(nodes), f"not every worker answered: {nodes}"
    return nodes


def pool_child(cluster: WorkerCluster, pid: int) -> int:
    """``pid``, checked to be a pool child, not a worker's main process."""
    assert pid not in {process.process.pid for process in cluster.processes if process.process}
    return pid


# ----- the faults -----

def killed_holder_frees_its_slot(cluster: WorkerCluster, fault: str, victim: AsyncResult,
                                 kill, key: str, quick: float = QUICK) -> None:
    """Shared by the faults where the worker's main process sees a run die.

    ``victim`` holds ``key``'s slot; a waiter of the same key is refused; ``kill(pid)``
    ends the victim's body and returns the server time (µs) it did. The waiter must start
    within ``quick`` seconds of that, and never beside the victim.
    """
    record = record_store(cluster)
    hold = cluster.app.tasks[HOLD]
    wait_started(record, victim, "the victim")
    pid = pool_child(cluster, int(record.hget("pid", victim.id)))
    waiter = hold.delay(0.3, key=key)
    wait_refused(record, waiter, "the waiter")
    assert holders(cluster, HOLD_PREFIX + key) == 1

    killed_at = kill(pid)
    back_at = wait_started(record, waiter, "the waiter", timeout=LONG_LEASE)
    back = seconds_between(killed_at, back_at)
    MEASURED[fault].append(back)
    assert back < quick, f"the slot came back after {back:.3f} s, not at once"

    assert waiter.get(timeout=TIMEOUT) == waiter.id
    assert peaks(record, HOLD_PREFIX + key) == [1, 1], "the waiter ran beside the victim"
    assert_ran_once(record, victim, waiter)
    assert slots_come_back(cluster, HOLD_PREFIX + key)
    assert_countdowns_short(cluster)


def test_pool_child_killed(worker_cluster_factory: WorkerClusterFactory) -> None:
    """A pool child SIGKILLed mid-task (as by the OOM killer): WorkerLostError in the
    main process, which frees the slot at once."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=2)
    record = record_store(cluster)
    victim = cluster.app.tasks[HOLD].delay(60, key="sigkill")

    def kill(pid: int) -> int:
        killed_at = server_time_us(record)
        os.kill(pid, signal.SIGKILL)
        return killed_at

    killed_holder_frees_its_slot(cluster, "pool child SIGKILL", victim, kill, "sigkill",
                                 quick=LOST_CHILD_NOTICED)
    assert not record.hexists("ended", victim.id)
    wait_state(victim, "FAILURE", "the victim")
    assert record.hget("failed", victim.id) == "WorkerLostError"
    assert re.search(rf"freed 1 slot\(s\) of {HOLD}\[{victim.id}\] \(WorkerLostError\)",
                     cluster.logs())


def test_hard_time_limit(worker_cluster_factory: WorkerClusterFactory) -> None:
    """A task past its hard time_limit is killed by the main process, which frees its
    slot at once."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=2)
    record = record_store(cluster)
    victim = cluster.app.tasks[TIME_LIMITED].delay(60, key="limit")

    def kill(pid: int) -> int:  # the time limit does it
        return started_us(record, victim) + TIME_LIMIT * 1_000_000

    killed_holder_frees_its_slot(cluster, "hard time limit", victim, kill, "limit")
    wait_state(victim, "FAILURE", "the victim")
    assert record.hget("failed", victim.id) == "TimeLimitExceeded"


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_revoke_terminate(worker_cluster_factory: WorkerClusterFactory,
                          signal_name: str) -> None:
    """revoke(terminate=True): task_revoked(terminated=True) in the main process, which
    frees the slot at once. With SIGTERM (Celery's default) the child raises SystemExit
    and may give the slot back itself first; with SIGKILL only the main process can."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=2)
    record = record_store(cluster)
    victim = cluster.app.tasks[HOLD].delay(60, key="revoke")

    def kill(pid: int) -> int:
        revoked_at = server_time_us(record)
        cluster.app.control.revoke(victim.id, terminate=True, signal=signal_name)
        return revoked_at

    killed_holder_frees_its_slot(cluster, f"revoke(terminate=True, {signal_name})", victim,
                                 kill, "revoke")
    wait_state(victim, "REVOKED", "the victim")
    if signal_name == "SIGKILL":
        assert not record.hexists("ended", victim.id)
        # Freed by the main process, at once or as soon as the child has exited.
        assert re.search(rf"freed 1 slot\(s\) of {HOLD}\[{victim.id}\]", cluster.logs())
    else:
        assert record.hget("exited", victim.id) == "SystemExit"


def test_hard_time_limit_with_slow_failure_reporter(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    """As test_hard_time_limit, but a task_failure receiver of the app takes 1.5 s (as an
    error reporter might), so the pool child is killed seconds after Celery reports the
    time limit: its slot must not be freed while its body still runs."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=1)
    record = record_store(cluster)
    nodes = node_names(cluster)
    # The waiter on the other worker: worker1's main process is busy reporting.
    victim = cluster.app.tasks[SLOW_REPORTED].apply_async(
        (60,), {"key": "slow"}, queue=worker_direct(nodes["worker1"]))
    wait_started(record, victim, "the victim")
    waiter = cluster.app.tasks[HOLD].apply_async(
        (0.1,), {"key": "slow"}, queue=worker_direct(nodes["worker2"]))
    assert waiter.get(timeout=TIMEOUT + 2 * SLOW_REPORT_SECONDS) == waiter.id
    assert peaks(record, HOLD_PREFIX + "slow") == [1, 1], "the waiter ran beside the victim"
    assert started_us(record, waiter) >= ended_us(record, victim)
    assert record.hget("failed", victim.id) == "TimeLimitExceeded"


def test_whole_worker_killed_and_restarted(worker_cluster_factory: WorkerClusterFactory
                                           ) -> None:
    """A worker SIGKILLed whole (main process and pool children) leaves its slot behind;
    restarted under the same node name it frees it at start-up, and leaves alone the slot
    a live task holds on another worker."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=1)
    record = record_store(cluster)
    hold = cluster.app.tasks[HOLD]
    nodes = node_names(cluster)
    victim = hold.apply_async((60,), {"key": "dead"}, queue=worker_direct(nodes["worker1"]))
    bystander = hold.apply_async((60,), {"key": "alive"},
                                 queue=worker_direct(nodes["worker2"]))
    wait_started(record, victim, "the victim")
    wait_started(record, bystander, "the bystander")
    assert record.hget("host", victim.id) == nodes["worker1"]
    assert record.hget("host", bystander.id) == nodes["worker2"]
    bystander_members = lock_store(cluster).zrange(
        lock_key(cluster, HOLD_PREFIX + "alive"), 0, -1)

    expires_at = lease_end_us(cluster, HOLD_PREFIX + "dead")
    killed_at = server_time_us(record)
    cluster.worker("worker1").kill()
    assert holders(cluster, HOLD_PREFIX + "dead") == 1, "nobody frees it until the restart"

    cluster.restart_worker("worker1")
    wait_until(lambda: holders(cluster, HOLD_PREFIX + "dead") == 0, LONG_LEASE,
               "the restarted worker to free its predecessor's slot")
    back_at = server_time_us(record)
    MEASURED["whole worker SIGKILL + restart"].append(seconds_between(killed_at, back_at))
    # Freed by the restarted worker, not left to expire: before the dead run's lease
    # ran out (server clock), however long a loaded machine takes to restart a worker.
    assert back_at < expires_at, "the slot came back only when its lease ran out"
    assert re.search(r"freed 1 slot\(s\) still held by a previous run of "
                     + re.escape(nodes["worker1"]), cluster.worker("worker1").log_text())

    # The other worker's live task still holds its slot, untouched.
    assert holders(cluster, HOLD_PREFIX + "alive") == 1
    assert lock_store(cluster).zrange(
        lock_key(cluster, HOLD_PREFIX + "alive"), 0, -1) == bystander_members
    assert not record.hexists("ended", bystander.id)
    assert not record.hexists("lease_lost", bystander.id)

    # The freed slot is usable, and never shared with the dead body's process.
    waiter = hold.apply_async((0.2,), {"key": "dead"}, queue=worker_direct(nodes["worker1"]))
    assert waiter.get(timeout=TIMEOUT) == waiter.id
    assert peaks(record, HOLD_PREFIX + "dead") == [1, 1]
    assert_ran_once(record, victim, bystander, waiter)

    cluster.app.control.revoke(bystander.id, terminate=True)
    wait_until(lambda: holders(cluster, HOLD_PREFIX + "alive") == 0, QUICK,
               "the bystander's slot to be freed")
    assert "LEASE LOST" not in cluster.logs()


def test_warm_shutdown(worker_cluster_factory: WorkerClusterFactory) -> None:
    """SIGTERM to a worker while it runs a task: the task finishes, its slot is released,
    and a waiter on another worker takes it."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=1)
    record = record_store(cluster)
    hold = cluster.app.tasks[HOLD]
    nodes = node_names(cluster)
    running = hold.apply_async((2.0,), {"key": "warm"}, queue=worker_direct(nodes["worker1"]))
    wait_started(record, running, "the running task")
    waiter = hold.apply_async((0.2,), {"key": "warm"}, queue=worker_direct(nodes["worker2"]))
    wait_refused(record, waiter, "the waiter")

    worker1 = cluster.worker("worker1")
    worker1.terminate()
    assert running.get(timeout=TIMEOUT) == running.id
    back_at = wait_started(record, waiter, "the waiter")
    back = seconds_between(ended_us(record, running), back_at)
    MEASURED["warm shutdown (SIGTERM)"].append(back)
    assert back < QUICK
    assert waiter.get(timeout=TIMEOUT) == waiter.id
    assert worker1.wait(time.monotonic() + TIMEOUT), "worker1 did not shut down"
    assert worker1.returncode == 0

    assert peaks(record, HOLD_PREFIX + "warm") == [1, 1]
    assert_ran_once(record, running, waiter)
    assert record.hget("host", waiter.id) == nodes["worker2"]
    assert slots_come_back(cluster, HOLD_PREFIX + "warm")
    assert "LEASE LOST" not in cluster.logs()
    assert_countdowns_short(cluster)


def test_cold_shutdown(worker_cluster_factory: WorkerClusterFactory) -> None:
    """SIGQUIT to a worker (cold shutdown) while it runs a task: the pool child is killed
    without its ``finally``; the main process frees the slot as it exits, long before the
    lease would run out, and a waiter on another worker takes it."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=1)
    record = record_store(cluster)
    hold = cluster.app.tasks[HOLD]
    nodes = node_names(cluster)
    running = hold.apply_async((60.0,), {"key": "cold"}, queue=worker_direct(nodes["worker1"]))
    wait_started(record, running, "the running task")
    waiter = hold.apply_async((0.2,), {"key": "cold"}, queue=worker_direct(nodes["worker2"]))
    wait_refused(record, waiter, "the waiter")

    worker1 = cluster.worker("worker1")
    expires_at = lease_end_us(cluster, HOLD_PREFIX + "cold")
    quit_at = server_time_us(record)
    os.kill(worker1.process.pid, signal.SIGQUIT)
    assert worker1.wait(time.monotonic() + TIMEOUT), "worker1 did not stop"
    back_at = wait_started(record, waiter, "the waiter")
    MEASURED["cold shutdown (SIGQUIT)"].append(seconds_between(quit_at, back_at))
    # Freed as the worker exited, not left to expire: the waiter started before the
    # killed run's lease would have run out (server clock), however slow the machine.
    assert back_at < expires_at, "the slot came back only when its lease ran out"
    assert waiter.get(timeout=TIMEOUT) == waiter.id
    assert peaks(record, HOLD_PREFIX + "cold") == [1, 1]
    assert slots_come_back(cluster, HOLD_PREFIX + "cold")


def test_lock_store_flushed(worker_cluster_factory: WorkerClusterFactory) -> None:
    """The lock store's database is flushed while a task holds a 1 s lease: its next
    renewal finds the store's incarnation gone and writes its lease back (nothing is
    reported lost), no run is admitted beside it meanwhile (nor afresh for the longest
    lease of the app's tasks, 30 s: a holder of another key may still re-assert), and
    the key limits new runs as before, with nothing left over."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=2)
    record = record_store(cluster)
    short = cluster.app.tasks[SHORT_LEASE]
    victim = short.delay(2.0, key="flush")
    wait_started(record, victim, "the victim")
    assert holders(cluster, SHORT_PREFIX + "flush") == 1

    flushed_at = server_time_us(record)
    lock_store(cluster).flushdb()
    after = [short.delay(0.3, key="flush") for _ in range(3)]
    wait_until(lambda: holders(cluster, SHORT_PREFIX + "flush") == 1, QUICK,
               "the victim to re-assert its lease")
    back = seconds_between(flushed_at, server_time_us(record))
    MEASURED["lock store flushed: lease re-asserted"].append(back)
    assert victim.get(timeout=TIMEOUT) == victim.id
    assert record.hget("lost", victim.id) == "0"
    assert not record.hexists("lease_lost", victim.id)

    # The limit holds throughout: three runs of the key, one at a time, after the victim.
    assert [result.get(timeout=TIMEOUT + LONG_LEASE) for result in after] == [
        r.id for r in after]
    first = min(started_us(record, result) for result in after)
    MEASURED["lock store flushed: next admission"].append(seconds_between(flushed_at, first))
    assert first >= ended_us(record, victim)
    assert peaks(record, SHORT_PREFIX + "flush") == [1, 1, 1, 1]
    assert sum(int(record.hget("refused", r.id) or 0) for r in after) >= 2
    assert_ran_once(record, victim, *after)
    assert [record.hget("lost", result.id) for result in after] == ["0"] * 3
    assert first >= flushed_at + LONG_LEASE * 1e6 * 0.99  # server, test clocks may differ
    assert slots_come_back(cluster, SHORT_PREFIX + "flush")
    logs = "".join(process.log_path.read_text() for process in cluster.processes)
    assert "LEASE LOST" not in logs
    assert "re-asserted its lease" in logs
    assert_countdowns_short(cluster)


def test_fences_increase(worker_cluster_factory: WorkerClusterFactory) -> None:
    """Fencing numbers of successive runs of one key strictly increase, also across an
    idle gap in which the key expired."""
    cluster = start_cluster(worker_cluster_factory, workers=2, concurrency=2)
    record = record_store(cluster)
    hold = cluster.app.tasks[HOLD]
    lock = lock_store(cluster)
    key = lock_key(cluster, HOLD_PREFIX + "fence")

    before = [hold.delay(0.1, key="fence") for _ in range(4)]
    assert [result.get(timeout=TIMEOUT) for result in before] == [r.id for r in before]
    assert slots_come_back(cluster, HOLD_PREFIX + "fence")

    # The idle key expires (sooner than its own 60 s, but by Redis all the same).
    assert lock.exists(key)
    lock.pexpire(key, 1)
    wait_until(lambda: not lock.exists(key), QUICK, "the idle key to expire")

    after = [hold.delay(0.1, key="fence") for _ in range(3)]
    assert [result.get(timeout=TIMEOUT) for result in after] == [r.id for r in after]

    runs = sorted(before + after, key=lambda result: started_us(record, result))
    fences = [int(record.hget("fence", result.id)) for result in runs]
    assert all(a < b for a, b in zip(fences, fences[1:])), f"fences: {fences}"
    gap = max(int(record.hget("fence", r.id)) for r in before)
    assert min(int(record.hget("fence", r.id)) for r in after) > gap
    assert peaks(record, HOLD_PREFIX + "fence") == [1] * 7
    assert_ran_once(record, *runs)
