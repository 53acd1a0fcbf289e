"""End to end: limits from ``redislock_limits`` on plain tasks, across real prefork workers.

The workers run :mod:`config_app`, whose tasks are plain ``@app.task`` functions limited
only by the setting: a concurrency limit, a global rate limit per key, and a task under
two limits at once (a slot per merchant and a global rate).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, List

import pytest

from celery_redislock import RateLimiter, Semaphore

from cluster_checks import (
    assert_each_ran_once,
    assert_no_lease_lost,
    assert_slots_all_given_back,
    lock_store,
    lua_commands,
    peaks,
    record_store,
    wait_for_results,
    wait_until,
)
from config_app import (
    API_RATE_PER_SECOND,
    CALL_API,
    CHARGE,
    CHARGE_RATE_PER_SECOND,
    SEND_EMAIL,
    create_app,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory) -> WorkerCluster:
    """Three worker processes of the config-limited app, two prefork children each."""
    return worker_cluster_factory(workers=3, concurrency=2, app_module="config_app",
                                  app_factory=create_app)


def start_times(record, results) -> List[int]:
    """When the limits admitted each task, on the Redis server's clock (µs), in order."""
    return sorted(int(record.hget("admitted", result.id)) * 1000 for result in results)


def most_starts_in_any_window(starts: List[int], window_us: int) -> int:
    """The largest number of starts inside any half-open window of ``window_us``."""
    most, first = 0, 0
    for last, start in enumerate(starts):
        while start - starts[first] >= window_us:
            first += 1
        most = max(most, last - first + 1)
    return most


def promise_spacing(commands: List[List[str]], limiter: str) -> float:
    """The median step (µs) between the starts rate limiter ``limiter`` promised refused
    runs, in order: the pace at which it schedules a backlog, on the server's clock.

    Read from the limiter's script as the lock store ran it (``HSET <key> ... line <end>``:
    each promise, or start booked, moves the end of the line of promised starts), with
    MONITOR: runs that wait for a near start in their worker process are booked one (or
    promised it), and when a
    loaded machine brings a run back late is the machine's delay, not the limiter's. (A
    run that came back on time and found its start taken by a late one moves the line
    back by one: a rare step that is not a new promise, hence the median.)
    """
    ends = [int(dict(zip(words[2::2], words[3::2]))["line"]) for words in commands
            if words[0].upper() == "HSET" and "line" in words[2::2]
            and words[1].endswith(f":r:{limiter}")]
    steps = [later - earlier for earlier, later in zip(ends, ends[1:])]
    assert len(steps) >= 5, f"{limiter}: hardly any run was promised a start: {ends}"
    return statistics.median(steps)


def test_config_slots_limit_a_plain_task(cluster: WorkerCluster) -> None:
    task = cluster.app.tasks[SEND_EMAIL]
    results = [task.delay(n) for n in range(16)]
    assert sorted(wait_for_results(cluster, results)) == list(range(16))
    record = record_store(cluster)
    assert_each_ran_once(record, results)
    assert max(peaks(record, "email")) == 2
    assert_slots_all_given_back(cluster, [SEND_EMAIL])
    assert_no_lease_lost(cluster)


def test_global_rate_across_worker_processes(cluster: WorkerCluster) -> None:
    """A backlog of 60 calls at 20/s per token (burst 1), on 3 workers x 2 processes:
    never more than 20 + 1 admissions in any second, and the limiter schedules the
    backlog at the full rate: the starts it promises the runs are one interval apart on
    the server's clock (a run that a loaded machine brings back late is the machine's
    delay, not the limiter's), and another token is not held up behind it."""
    task = cluster.app.tasks[CALL_API]
    count = 3 * API_RATE_PER_SECOND
    with lua_commands(cluster) as commands:
        results = [task.delay("t1") for _ in range(count)]
        other = [task.delay("t2") for _ in range(5)]  # another token has its own rate
        wait_for_results(cluster, results + other)

    record = record_store(cluster)
    assert_each_ran_once(record, results + other)
    starts = start_times(record, results)
    assert most_starts_in_any_window(starts, 1_000_000) <= API_RATE_PER_SECOND + 1
    assert promise_spacing(commands, "token:t1") == pytest.approx(
        1_000_000 / API_RATE_PER_SECOND, abs=1)
    assert start_times(record, other)[0] < starts[-1], "token t2 waited behind t1"


def spend_rate_ahead(cluster: WorkerCluster, seconds: int) -> None:
    """Spend ``seconds`` of ``charge``'s rate before its runs are sent: they then find a
    backlog of starts and are promised them in a row, however slowly a loaded machine
    delivers them (at load ~19 the worker received 25 charges slower than 10/s, and the
    limiter admitted most at once: 3 promises)."""
    spender = RateLimiter(lock_store(cluster), CHARGE, rate=f"{CHARGE_RATE_PER_SECOND}/s",
                          burst=CHARGE_RATE_PER_SECOND * seconds)
    spent = 0
    while spender.try_acquire():
        spent += 1
        assert spent <= 4 * CHARGE_RATE_PER_SECOND * seconds, "the rate is never spent"
    assert spent >= CHARGE_RATE_PER_SECOND * seconds


def test_two_limits_are_taken_together(cluster: WorkerCluster) -> None:
    """charge has a slot per merchant and a global 10/s rate. While the test holds
    merchant 1's slot, merchant 1's charges wait without spending the rate (they are
    never admitted, nor sent back with a promised start), so the other merchants'
    charges are still scheduled at the full rate (the starts the limiter promises are one
    interval apart on the server's clock); neither limit is ever exceeded."""
    task = cluster.app.tasks[CHARGE]
    blocker = Semaphore(lock_store(cluster), "merchant:1")
    held = blocker.acquire(blocking=False)
    spend_rate_ahead(cluster, seconds=2)
    with lua_commands(cluster) as commands:
        blocked = [task.delay(1, amount) for amount in range(4)]
        # 25 charges (2.5 s at the rate): a loaded machine that receives the first few
        # slower than the rate still leaves a backlog whose starts are promised in a row.
        free = [task.delay(2 + amount % 3, amount, seconds=0.05) for amount in range(25)]
        wait_for_results(cluster, free)

    record = record_store(cluster)
    assert not any(record.hexists("started", result.id) for result in blocked)
    assert not any(record.exists(f"promised:{result.id}") for result in blocked)
    assert promise_spacing(commands, CHARGE) == pytest.approx(
        1_000_000 / CHARGE_RATE_PER_SECOND, abs=1)

    blocker.release(held)
    wait_for_results(cluster, blocked)
    assert_each_ran_once(record, blocked + free)
    for merchant in (1, 2, 3, 4):
        assert max(peaks(record, f"merchant:{merchant}")) == 1
    every = start_times(record, blocked + free)
    assert most_starts_in_any_window(every, 1_000_000) <= CHARGE_RATE_PER_SECOND + 1
    wait_until(lambda: Semaphore(lock_store(cluster), "merchant:2").holders() == 0, 5,
               "merchant 2's slot to be given back")
    assert_no_lease_lost(cluster)
