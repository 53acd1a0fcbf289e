"""Fair shares with real workers on the parking line (``fair_by``): one tenant's
backlog does not hold back the others' runs; never more than the cap at once."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, List, Tuple

import pytest
import redis
from celery.result import AsyncResult

from cluster_checks import peaks, record_store, wait_for_results, wait_until
from fair_app import FAIR, FAIR_SLOTS, PRIO, PRIO_AGING

if TYPE_CHECKING:
    from worker_cluster import WorkerClusterFactory

TIMEOUT = 60.0


@pytest.fixture
def start_cluster(start_workers: WorkerClusterFactory) -> WorkerClusterFactory:
    return lambda **options: start_workers("fair_app", concurrency=2, **options)


def ended(record: redis.Redis, results: List[AsyncResult]) -> List[int]:
    return sorted(int(record.hget("ended", result.id)) for result in results)


def started_once_known(record: redis.Redis, backlog: List[AsyncResult],
                       others: List[AsyncResult]) -> int:
    """How many of the backlog's runs started after every other tenant's run was in the
    line (the last one's first refusal) and ended before the last other tenant's run:
    the runs the line's order let pass them. (The backlog's runs before then are not
    the line's to order: the others' messages reach the workers behind the backlog's in
    the task queue, later the more loaded the machine.)"""
    known = max(int(record.hget("refused_at", result.id) or 0) for result in others)
    last = ended(record, others)[-1]
    return sum(1 for result in backlog
               if int(record.hget("started", result.id)) > known
               and int(record.hget("ended", result.id)) < last)


def send_backlog_then_others(cluster: Any, record: redis.Redis
                             ) -> Tuple[List[AsyncResult], List[AsyncResult]]:
    """30 runs of tenant ``big`` of 0.1 s, then, once the first has started, 2 runs of
    each of 4 other tenants: ``(backlog, others)``."""
    task = cluster.app.tasks[FAIR]
    backlog = [task.delay(0.1, tenant="big") for _ in range(30)]
    wait_until(lambda: int(record.hlen("started")) >= 1, TIMEOUT, "the backlog's first")
    others = [task.delay(0.1, tenant=f"t{n}") for n in range(4) for _ in range(2)]
    return backlog, others


def test_a_backlog_does_not_hold_back_other_tenants(start_cluster: Any) -> None:
    """30 runs of one tenant sent first, then 2 runs of each of 4 tenants: the others'
    runs end among the first of the backlog's, not after all of it (first come first
    served: after the 30). Once the line holds them all, at most 6 of the backlog's
    runs start before the last of theirs ends: the 2 slots' moved copies on their way,
    and the backlog's turn in each of the 2 rounds of 5 tenants (2), with 2 to spare.
    (How many of the backlog's end before the others are in the line at all depends on
    the machine's load, not on the line: 4-10 of them at load 10-18.)"""
    cluster = start_cluster()
    record = record_store(cluster)
    backlog, others = send_backlog_then_others(cluster, record)
    wait_for_results(cluster, backlog + others)
    big, small = ended(record, backlog), ended(record, others)
    before = sum(1 for end in big if end < small[-1])
    passed = started_once_known(record, backlog, others)
    print(f"\nthe last other tenant's run ended after {before} of the backlog's 30, "
          f"{passed} of them started once the others were in the line")
    assert before < len(backlog)
    assert passed <= 6
    assert max(peaks(record, "fair")) == FAIR_SLOTS
    assert " parked: " in cluster.logs()


def test_a_low_priority_starts_within_the_aging_bound(start_cluster: Any) -> None:
    """One slot, 0.1 s bodies; a steady stream of runs at priority 5, faster than they
    are served; a run at priority 0 sent 0.5 s in (a Redis broker: message priorities
    4 and 9, which wait as 9 - p). Without aging it would start after the stream; with
    0.2 s per step no run at 5 that started waiting more than 5 x 0.2 = 1 s after it
    starts before it (judged by send times, with 1 s for the two runs' receipts: the
    Redis broker hands out its priority 9 after its 4), and it does not start at once."""
    from cluster_checks import server_time_us

    cluster = start_cluster()
    record = record_store(cluster)
    task = cluster.app.tasks[PRIO]
    high: List[Tuple[int, AsyncResult]] = []
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            high.append((server_time_us(record), task.apply_async((0.1, "high"), priority=4)))
            time.sleep(0.07)

    sender = threading.Thread(target=stream)
    sender.start()
    try:
        time.sleep(0.5)
        sent = server_time_us(record)
        low = task.apply_async((0.1, "low"), priority=9)
        wait_until(lambda: record.hget("started", low.id) is not None, 20.0, "the low run")
        time.sleep(1.0)  # the stream goes on after it
    finally:
        stop.set()
        sender.join()
    low_start = int(record.hget("started", low.id))
    starts = [(at, int(record.hget("started", r.id) or 0)) for at, r in high]
    after = sum(1 for _, start in starts if start > low_start)
    meanwhile = sum(1 for _, start in starts if sent < start < low_start)
    passed_late = [(at - sent) / 1e6 for at, start in starts
                   if 0 < start < low_start and at > sent + (5 * PRIO_AGING + 1.0) * 1e6]
    print(f"\nthe low run started {(low_start - sent) / 1e6:.2f} s after it was sent; "
          f"{meanwhile} high runs started meanwhile, {after} of {len(high)} after it "
          f"(aging {PRIO_AGING} s per step)")
    assert passed_late == []  # sent so long after it that they wait behind it
    assert meanwhile >= 3  # read higher first (9 - p), it would have gone next
    assert after > 0
    assert max(peaks(record, "prio")) == 1


def test_a_redis_message_priority_of_0_goes_first(start_cluster: Any) -> None:
    """On a Redis broker (kombu serves a message priority of 0 first, and a message sent
    without one carries 0): one slot held; 3 runs sent with priority 9, then 3 with 0 and
    2 without: once the holder ends, the 5 of priority 0 start before the 3 of 9."""
    from celery_redislock.engine.keys import semaphore_key
    from celery_redislock.engine.parked_view import read_parked_lines

    from cluster_checks import lock_store, server_time_us

    cluster = start_cluster(workers=1)
    record, store = record_store(cluster), lock_store(cluster)
    task = cluster.app.tasks[PRIO]
    holder = task.apply_async((3.0, "holder"))
    wait_until(lambda: record.hget("started", holder.id) is not None, TIMEOUT, "the holder")
    last = [task.apply_async((0.05, "last"), priority=9) for _ in range(3)]
    first = [task.apply_async((0.05, "first"), priority=0) for _ in range(3)]
    first += [task.apply_async((0.05, "first")) for _ in range(2)]
    key = semaphore_key("prio", "redislock:")

    def parked() -> int:
        line = read_parked_lines(store, [key], server_time_us(store) // 1000).get(key)
        return 0 if line is None else line.references_waiting

    wait_until(lambda: parked() == 8, TIMEOUT, "8 runs parked")
    assert record.hget("ended", holder.id) is None, "the holder ended before all parked"
    wait_for_results(cluster, [holder, *last, *first])
    started = {r.id: int(record.hget("started", r.id)) for r in [*last, *first]}
    assert max(started[r.id] for r in first) < min(started[r.id] for r in last)
    assert max(peaks(record, "prio")) == 1


def test_the_lock_store_restarted_empty_while_tenants_wait(start_cluster: Any) -> None:
    """The store loses its sub-lines' turns and counts: the runs parked in the tenants'
    parking queues are counted again from the broker and each runs once."""
    from test_store_loss import restart_lock_store_empty

    cluster = start_cluster(separate_lock_store=True)
    record = record_store(cluster)
    task = cluster.app.tasks[FAIR]
    results = [task.delay(0.5, tenant=f"t{n % 3}") for n in range(10)]
    wait_until(lambda: int(record.hlen("started")) >= FAIR_SLOTS, TIMEOUT, "the first runs")
    restart_lock_store_empty(cluster)
    wait_for_results(cluster, results)
    assert [int(record.get(f"runs:{r.id}") or 0) for r in results] == [1] * len(results)
    assert max(peaks(record, "fair")) <= FAIR_SLOTS


def test_rabbitmq_as_the_broker(start_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with RabbitMQ as the broker: a parking queue per tenant (a move: get,
    publish, acknowledge); each run once, never over the cap."""
    import uuid

    from test_rabbitmq import rabbitmq_answers

    from celery_redislock.engine.keys import semaphore_key
    from celery_redislock.parking import line_name, parking_queue

    from parking_app import RABBIT_ENV
    if not rabbitmq_answers():
        pytest.skip("no RabbitMQ answers")
    monkeypatch.setenv(RABBIT_ENV, "1")
    cluster = start_cluster()
    record = record_store(cluster)
    tenants = [f"r{uuid.uuid4().hex[:8]}" for _ in range(3)]
    try:
        results = [cluster.app.tasks[FAIR].delay(0.2, tenant=tenants[n % 3])
                   for n in range(12)]
        wait_for_results(cluster, results)
        assert [int(record.get(f"runs:{r.id}") or 0) for r in results] == [1] * 12
        assert max(peaks(record, "fair")) == FAIR_SLOTS
        assert " parked: " in cluster.logs()
    finally:
        with cluster.app.connection_for_write() as connection:
            channel = connection.default_channel
            channel.queue_delete(cluster.app.conf.task_default_queue)
            key = semaphore_key("fair", "redislock:")
            for tenant in tenants:
                channel.queue_delete(parking_queue(line_name(key, f"tenant:{tenant}")))
