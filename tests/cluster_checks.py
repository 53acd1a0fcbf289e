"""Checks shared by the end-to-end tests: what the task bodies recorded, and the lock store."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List

import redis
from celery.result import AsyncResult, ResultSet

from celery_redislock import Semaphore

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster

#: Longest wait for a batch of tasks to finish (seconds).
RESULTS_TIMEOUT = 60.0


def record_store(cluster: WorkerCluster) -> redis.Redis:
    """A client of the database where the task bodies record their runs."""
    assert cluster.urls is not None
    return redis.Redis.from_url(cluster.urls.record, decode_responses=True)


def lock_store(cluster: WorkerCluster) -> redis.Redis:
    """A client of the lock store's database."""
    assert cluster.urls is not None
    return redis.Redis.from_url(cluster.urls.lock)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_for_results(cluster: WorkerCluster, results: List[AsyncResult]) -> List[Any]:
    """The return values of ``results`` once all succeeded; fail on error, timeout, or
    when a worker process exits meanwhile."""
    pending = ResultSet(results, app=cluster.app)

    def all_ready() -> bool:
        cluster.check_running()
        return pending.ready()

    wait_until(all_ready, RESULTS_TIMEOUT, f"{len(results)} task results", interval=0.05)
    values = pending.join(timeout=RESULTS_TIMEOUT)
    assert [result.status for result in results] == ["SUCCESS"] * len(results)
    return values


def peaks(record: redis.Redis, key: str) -> List[int]:
    """How many bodies of ``key`` were running as each of them started."""
    return [int(value) for value in record.lrange(f"peaks:{key}", 0, -1)]


def assert_each_ran_once(record: redis.Redis, results: List[AsyncResult]) -> None:
    """Every task's body ran exactly once, however often it went back to the queue."""
    runs = {result.id: record.get(f"runs:{result.id}") for result in results}
    assert runs == {result.id: "1" for result in results}


def holders(cluster: WorkerCluster, name: str) -> int:
    """How many live leases the semaphore ``name`` has now."""
    return Semaphore(lock_store(cluster), name).holders()


def assert_slots_all_given_back(cluster: WorkerCluster, names: List[str]) -> None:
    """Every slot of the semaphores ``names`` was released (none is left to expire): a
    run's release goes with its process's next request to the lock store, or from its
    lease keeper within about 10 ms, so it may come moments after the run's result."""
    wait_until(lambda: all(holders(cluster, name) == 0 for name in names), 5,
               f"the slots of {names} to come back")


def slots_come_back(cluster: WorkerCluster, name: str) -> bool:
    """Wait until semaphore ``name`` has no holder (see :func:`assert_slots_all_given_back`)."""
    assert_slots_all_given_back(cluster, [name])
    return True


def assert_no_lease_lost(cluster: WorkerCluster) -> None:
    """No worker logged that a lease ran out while its task still ran."""
    assert "LEASE LOST" not in cluster.logs()


def server_time_us(client: redis.Redis) -> int:
    """The Redis server's clock, in microseconds (the clock the records use)."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)




@contextmanager
def lua_commands(cluster: WorkerCluster) -> Iterator[List[List[str]]]:
    """The commands the lock store's scripts ran during the block, each as its words, in
    the order the server ran them (read with MONITOR): what the scripts decided, however
    late loaded worker processes got round to acting on it. Filled when the block ends."""
    with _monitored(cluster, lambda event: event["client_type"] == "lua") as commands:
        yield commands


@contextmanager
def store_commands(cluster: WorkerCluster) -> Iterator[List[List[str]]]:
    """The commands clients sent to the lock store's database during the block (not
    those its scripts ran), each as its words, in the order the server ran them (read
    with MONITOR). Filled when the block ends."""
    assert cluster.urls is not None
    database = int(cluster.urls.lock.rsplit("/", 1)[1])
    with _monitored(cluster, lambda event: event["client_type"] != "lua"
                    and int(event["db"]) == database) as commands:
        yield commands


@contextmanager
def _monitored(cluster: WorkerCluster,
               keep: Callable[[Dict[str, Any]], bool]) -> Iterator[List[List[str]]]:
    """The commands the lock store's server ran during the block that ``keep`` keeps
    (given MONITOR's event), each as its words, in order. Filled when the block ends."""
    commands: List[List[str]] = []
    ready, end = threading.Event(), f"monitored-end-{id(commands)}"

    def watch() -> None:
        with lock_store(cluster).monitor() as monitor:
            ready.set()
            for event in monitor.listen():
                words = event["command"].split()
                if words[:2] == ["ECHO", end]:
                    return
                if keep(event):
                    commands.append(words)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ready.wait(10), "MONITOR did not start"
    try:
        yield commands
    finally:
        lock_store(cluster).echo(end)
        watcher.join(30)
        assert not watcher.is_alive(), "MONITOR did not end"
