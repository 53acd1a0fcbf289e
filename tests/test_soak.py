"""Soak: thousands of tasks over dozens of keys on several workers, while pool children
are SIGKILLed and the lock store is restarted; then an invariant check.

Marked ``soak``: not part of the default run. Run it with::

    .venv/bin/python -m pytest -m soak -s

It prints a report: per key the peak of bodies at once against the limit, the tasks
completed, those that ran twice (only ever ones whose body was killed: acks_late and
reject_on_worker_lost make Celery run them again), and the slots still held once
everything settled (must be 0).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from typing import TYPE_CHECKING, Dict, List, Set

import pytest
import redis
from celery.result import ResultSet

from celery_redislock import Semaphore

import soak_app
from cluster_checks import peaks, record_store
from redis_process import RedisServer
from support import wait_until

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.soak

TASKS = 2000
KEYS = 24
KILL_EVERY = 1.0  # seconds between two SIGKILLs of a running pool child
DEADLINE = 300.0


@pytest.fixture
def lock_server():
    """The lock store: append-only with fsync, so a restart keeps the leases."""
    server = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    yield server.start()
    server.cleanup()


def running_bodies(record: redis.Redis) -> Dict[str, int]:
    """Task id -> pid of every body that has recorded its start but not its end."""
    bodies = {}
    for key in record.scan_iter("running:*"):
        for task_id, identity in record.hgetall(key).items():
            bodies[task_id] = int(identity.split(":")[0])
    return bodies


def test_soak(worker_cluster_factory: WorkerClusterFactory, lock_server: RedisServer,
              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(soak_app.LOCK_URL_ENV, lock_server.url)
    cluster: WorkerCluster = worker_cluster_factory(
        workers=3, concurrency=3, app_module="soak_app", app_factory=soak_app.create_app)
    record = record_store(cluster)
    rng = random.Random(7)
    results = []
    for _ in range(TASKS):
        key = rng.randrange(KEYS)
        task = cluster.app.tasks[soak_app.TASK_FOR_SLOTS[soak_app.slots_of_key(key)]]
        results.append(task.delay(key, rng.uniform(0.01, 0.05)))
    pending = ResultSet(results, app=cluster.app)

    killed: Set[str] = set()
    killed_pids: Set[int] = set()
    restarted = False
    started = time.monotonic()
    next_kill = started + KILL_EVERY
    while not pending.ready():
        cluster.check_running()
        assert time.monotonic() - started < DEADLINE, "the soak did not finish in time"
        done = sum(result.ready() for result in results[::20]) * 20
        if not restarted and done >= TASKS // 3:
            lock_server.restart()  # the lock store goes away and comes back with its data
            restarted = True
        if time.monotonic() >= next_kill:
            bodies = running_bodies(record)
            if bodies:
                task_id, pid = rng.choice(sorted(bodies.items()))
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(task_id)
                    killed_pids.add(pid)
                except ProcessLookupError:
                    pass
            next_kill = time.monotonic() + KILL_EVERY
        time.sleep(0.05)

    states = Counter(result.state for result in results)
    runs = {result.id: int(record.get(f"runs:{result.id}") or 0) for result in results}
    twice = {task_id for task_id, count in runs.items() if count > 1}
    # A run killed mid-body, or after its body but before its message was acknowledged,
    # is redelivered (acks_late): it runs again, as Celery would run it without the
    # package. The pid read just before the kill may already run the next task, so what
    # counts is whether a process that ran one of the task's bodies was killed.
    killed_twice = {task_id for task_id in twice
                    if any(int(pid) in killed_pids
                           for pid in record.lrange(f"pids:{task_id}", 0, -2))}
    never = [task_id for task_id, count in runs.items() if count == 0]
    lock = lock_server.client()
    names = [f"soak:{key}" for key in range(KEYS)]
    wait_until(lambda: all(Semaphore(lock, name).holders() == 0 for name in names),
               timeout=soak_app.LEASE * 3, what="every slot to come back")
    peak_by_key = {key: max(peaks(record, f"soak:{key}") or [0]) for key in range(KEYS)}

    print(f"\nsoak: {TASKS} tasks over {KEYS} keys, 3 workers x 3 processes, "
          f"{len(killed)} bodies SIGKILLed, lock store restarted: {restarted}")
    print(f"states: {dict(states)}; ran twice: {len(twice)} (all killed ones: "
          f"{twice <= killed}); never ran: {len(never)}")
    rows: List[str] = [f"  soak:{key:<3} peak {peak_by_key[key]} / limit "
                       f"{soak_app.slots_of_key(key)}" for key in range(KEYS)]
    print("\n".join(rows))
    print("slots still held after settling: 0")

    assert restarted and killed
    failures = {result.id: repr(result.result) for result in results if result.failed()}
    assert states == Counter({"SUCCESS": TASKS}), failures
    assert not never
    assert twice <= killed | killed_twice, \
        f"ran twice without being killed: {sorted(twice - killed - killed_twice)}"
    assert all(peak_by_key[key] <= soak_app.slots_of_key(key) for key in range(KEYS)), \
        peak_by_key
