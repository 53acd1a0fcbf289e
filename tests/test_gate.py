"""End to end: a limited run that waits is invisible to Celery's run semantics, however
the worker meets the wait (see :mod:`celery_redislock.gate.gate`).

Under a rate limit with a backlog, and with every pool process busy when the runs arrive
(prefork and threads pools), each task is seen by Celery once: ``task_prerun`` and
``task_postrun`` fire once, STARTED is not stored before the body's only start (the state
is PENDING at ``task_prerun``), and one ``task-received`` event is sent for it whatever
copies of its message the wait made. The workers run :mod:`gate_app`.
"""

from __future__ import annotations

import collections
import importlib.util
import threading
import time
from typing import TYPE_CHECKING, Any, Counter, Iterator, List

import pytest
import redis

from celery_redislock import Semaphore

from cluster_checks import (
    assert_each_ran_once,
    assert_no_lease_lost,
    assert_slots_all_given_back,
    lock_store,
    peaks,
    record_store,
    server_time_us,
    wait_for_results,
    wait_until,
)
from gate_app import PLAIN, POOL_ASKS_ENV, RATE, RATED, SLOTTED, SLOTTED_KEY, create_app
from worker_app import (
    LIMITED_KEY,
    LIMITED_SLEEP,
    SHORT_LEASE_KEY,
    SHORT_LEASE_SLEEP,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow

#: The gevent pool, tested where gevent is installed (the ``test`` extra brings it).
GEVENT = pytest.param("gevent", marks=pytest.mark.skipif(
    importlib.util.find_spec("gevent") is None, reason="gevent is not installed"))


class TaskEvents:
    """Counts the ``task-received`` events of a cluster, per task id, from a thread."""

    def __init__(self, cluster: WorkerCluster) -> None:
        self.cluster = cluster
        self.received: Counter[str] = collections.Counter()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        app = self.cluster.app
        with app.connection_for_read() as connection:
            self._receiver = app.events.Receiver(connection, handlers={
                "task-received": lambda event: self.received.update([event["uuid"]]),
            })
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self) -> TaskEvents:
        """Capture from now on: once a plain task's event has come (the subscription is
        in place then)."""
        self._thread.start()
        sent: List[str] = []

        def seen() -> bool:
            if not any(task_id in self.received for task_id in sent):
                sent.append(self.cluster.app.send_task(PLAIN, (0,)).id)
            return any(task_id in self.received for task_id in sent)

        wait_until(seen, 30, "the event receiver", interval=0.5)
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)


@pytest.fixture
def events_of() -> Iterator[Any]:
    started: List[TaskEvents] = []

    def start(cluster: WorkerCluster) -> TaskEvents:
        events = TaskEvents(cluster).start()
        started.append(events)
        return events

    yield start
    for events in started:
        events.stop()


def settled(cluster: WorkerCluster) -> bool:
    """No message waits in the broker or in a worker, and no slot is held."""
    assert cluster.urls is not None
    broker = redis.Redis.from_url(cluster.urls.broker)
    return (broker.hlen("unacked") == 0 and broker.llen("celery") == 0
            and Semaphore(lock_store(cluster), SLOTTED_KEY).holders() == 0)


def assert_seen_once(record: Any, events: TaskEvents, ids: List[str]) -> None:
    """Celery saw one run of each task: one prerun, one postrun, PENDING at prerun,
    one body, one task-received event."""
    assert {task_id: record.get(f"runs:{task_id}") for task_id in ids} == dict.fromkeys(
        ids, "1")
    # The callers waited for each body's end; task_postrun fires just after it, in the
    # pool process, and is not recorded yet if the test got there first.
    wait_until(lambda: all(record.hexists("postrun", task_id) for task_id in ids), 10,
               "the task_postrun of each task")
    prerun, postrun = record.hgetall("prerun"), record.hgetall("postrun")
    assert {task_id: prerun.get(task_id) for task_id in ids} == dict.fromkeys(ids, "1")
    assert {task_id: postrun.get(task_id) for task_id in ids} == dict.fromkeys(ids, "1")
    states = record.hgetall("prerun-state")
    assert {task_id: states.get(task_id) for task_id in ids} == dict.fromkeys(ids, "PENDING")
    wait_until(lambda: all(events.received[task_id] >= 1 for task_id in ids), 10,
               "a task-received event of each task")
    assert {task_id: events.received[task_id] for task_id in ids} == dict.fromkeys(ids, 1)


# gevent: a run parks from the greenlet that runs it, so it is one more run to Celery
# (prerun, postrun, task-received) there; its limits are tested by
# test_greenlets_keep_a_limit.
@pytest.mark.parametrize("pool", ["prefork"])
def test_a_rate_limited_backlog_is_run_once(worker_cluster_factory: WorkerClusterFactory,
                                            events_of: Any, pool: str,
                                            monkeypatch: Any) -> None:
    """Ten runs at once under a rate of 4/s (burst 1), on two workers of two processes
    (or greenlets): most wait (in the worker's main process for a start within half a
    second, or sent back with a promised start), yet each is one run to Celery."""
    cluster = worker_cluster_factory(workers=2, concurrency=2, app_module="gate_app",
                                     app_factory=create_app, pool=pool)
    events = events_of(cluster)
    record = record_store(cluster)
    ids = [cluster.app.send_task(RATED, (0.05,)).id for _ in range(10)]
    wait_until(lambda: all(record.hexists("postrun", task_id) for task_id in ids)
               and settled(cluster), 40, "ten runs")
    assert_seen_once(record, events, ids)
    starts = sorted(int(record.hget("started", task_id)) for task_id in ids)
    # Two starts at once (the burst), then one every 1/RATE s, 2 s in all: the rate held
    # them back (a body may start some way after its admission on a loaded machine).
    assert starts[-1] - starts[0] >= (len(ids) - 2) / RATE * 0.6 * 1_000_000


@pytest.mark.parametrize("pool", ["prefork", "threads"])  # gevent: see above
def test_runs_that_arrive_at_a_busy_pool_are_run_once(
        worker_cluster_factory: WorkerClusterFactory, events_of: Any, pool: str,
        monkeypatch: Any) -> None:
    """One worker of two processes (threads, greenlets), both busy with plain tasks of
    1.5 s when eight runs behind one slot and four under a rate of 4/s arrive (it
    prefetches eight messages): the limits of runs that wait for a free process are only
    probed, so no run reaches a process to be refused there; each is one run to Celery,
    and one at a time."""
    cluster = worker_cluster_factory(workers=1, concurrency=2, app_module="gate_app",
                                     app_factory=create_app, pool=pool)
    events = events_of(cluster)
    record = record_store(cluster)
    busy = [cluster.app.send_task(PLAIN, (1.5,)).id for _ in range(2)]
    wait_until(lambda: all(record.hexists("started", task_id) for task_id in busy), 20,
               "both processes to be busy")
    slotted = [cluster.app.send_task(SLOTTED, (0.2,)).id for _ in range(8)]
    rated = [cluster.app.send_task(RATED, (0.05,)).id for _ in range(4)]
    ids = slotted + rated
    wait_until(lambda: all(record.hexists("postrun", task_id) for task_id in ids)
               and settled(cluster), 40, "twelve runs")
    assert_seen_once(record, events, ids)
    assert max(int(n) for n in record.lrange(f"peaks:{SLOTTED_KEY}", 0, -1)) == 1
    assert min(int(record.hget("started", task_id)) for task_id in ids) >= min(
        int(record.hget("ended", task_id)) for task_id in busy)


def test_runs_the_main_process_could_not_ask_are_run_once(
        worker_cluster_factory: WorkerClusterFactory, events_of: Any) -> None:
    """The lock store answers nothing for 4 s (CLIENT PAUSE) as four runs behind one slot
    arrive: the worker's main process gives up on it after 1 s and sends the runs back,
    fail-closed, without asking for 5 s; none reaches a pool process to be sent back
    from there, and each is one run to Celery once the store answers again. A plain task
    sent after them starts well before the store answers: the worker's event loop did
    not wait for the store (it waited 10 s, the client's timeout, before)."""
    cluster = worker_cluster_factory(workers=1, concurrency=2, app_module="gate_app",
                                     app_factory=create_app, separate_lock_store=True)
    events = events_of(cluster)
    record = record_store(cluster)
    paused_at = server_time_us(record)
    lock_store(cluster).client_pause(4000, all=True)
    ids = [cluster.app.send_task(SLOTTED, (0.1,)).id for _ in range(4)]
    plain = cluster.app.send_task(PLAIN, (0,)).id
    wait_until(lambda: all(record.hexists("postrun", task_id) for task_id in ids)
               and settled(cluster), 40, "four runs")
    assert_seen_once(record, events, ids)
    assert min(int(record.hget("started", task_id)) for task_id in ids) > paused_at + 4_000_000
    assert int(record.hget("started", plain)) < paused_at + 3_000_000
    assert "could not reach the lock store" in cluster.logs()
    assert max(int(n) for n in record.lrange(f"peaks:{SLOTTED_KEY}", 0, -1)) == 1


def test_with_admission_in_the_pool_the_limit_holds_and_each_task_runs_once(
        worker_cluster_factory: WorkerClusterFactory, monkeypatch: Any) -> None:
    """``redislock_admit_before_pool = False``: the pool processes ask (a wait then shows
    to Celery as a run that ended IGNORED), and the limit and Celery's run count are the
    same: eight runs behind one slot on two workers run one at a time, each once."""
    monkeypatch.setenv(POOL_ASKS_ENV, "1")
    cluster = worker_cluster_factory(workers=2, concurrency=2, app_module="gate_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    ids = [cluster.app.send_task(SLOTTED, (0.2,)).id for _ in range(8)]
    wait_until(lambda: all(record.hexists("postrun", task_id) for task_id in ids)
               and settled(cluster), 60, "eight runs")
    assert {task_id: record.get(f"runs:{task_id}") for task_id in ids} == dict.fromkeys(
        ids, "1")
    assert max(int(n) for n in record.lrange(f"peaks:{SLOTTED_KEY}", 0, -1)) == 1
    prerun = record.hgetall("prerun")
    assert sum(int(prerun[task_id]) for task_id in ids) > len(ids)  # the pool asked


@pytest.mark.parametrize("pool", [GEVENT])
def test_greenlets_keep_a_limit(worker_cluster_factory: WorkerClusterFactory,
                                pool: str) -> None:
    """Two gevent workers of ten greenlets each, sixty runs behind two slots and two
    runs that outlive their lease of 1 s (the lease keeper, a greenlet there, renews
    them): never more than two at once, each run once, every slot given back, no lease
    lost. (A whole gevent worker killed is not tested: on a Redis broker kombu never
    redelivers its messages, see docs/semantics.md.)"""
    cluster = worker_cluster_factory(workers=2, concurrency=10, pool=pool)
    results = [cluster.app.send_task(LIMITED_SLEEP, (0.05,)) for _ in range(60)]
    results += [cluster.app.send_task(SHORT_LEASE_SLEEP, (2.5,)) for _ in range(2)]
    wait_for_results(cluster, results)
    record = record_store(cluster)
    assert_each_ran_once(record, results)
    assert max(peaks(record, LIMITED_KEY)) == 2
    assert max(peaks(record, SHORT_LEASE_KEY)) == 1
    assert_slots_all_given_back(cluster, [LIMITED_SLEEP, SHORT_LEASE_SLEEP])
    assert_no_lease_lost(cluster)
    assert "could not ask its limits" not in cluster.logs()


class _Request:
    """What :func:`gate._due_booking` reads of a request."""

    id = "booked-1"

    class task:
        name = "gate-unit.booked"

    def revoked(self) -> bool:
        return False


class _Consumer:
    """A worker's consumer with two pool processes and no request reserved."""

    class pool:
        num_processes = 2


@pytest.mark.parametrize("late, expected", [(0.0, "handed"), (0.5, "given back")])
def test_a_booked_start_goes_to_the_pool_only_on_time(redis_client, late: float,
                                                     expected: str) -> None:
    """A run held for its booked start goes to the pool under it when its timer fires on
    time; a timer that fires more than ``BOOKED_SLACK`` late (a stalled event loop) gives
    the start back, and the run asks anew."""
    from celery_redislock.engine.admission import Booked, RateLimit, admit
    from celery_redislock.engine.rate import Rate
    from celery_redislock.gate import gate, room

    limit = RateLimit("gate-unit", Rate.parse("10/s", burst=0), "redislock:")
    admit(redis_client, [limit], lease=5)
    booked = admit(redis_client, [limit], lease=5, book_ms=500)
    assert isinstance(booked, Booked)
    counted = int(redis_client.hget(limit.key, "tat"))
    hold = room.Hold()
    hold.booked, hold.due = booked, time.monotonic() - late
    handed = gate._due_booking(_Consumer(), _Request(), hold)
    assert hold.booked is None
    if expected == "handed":
        assert handed is not None and handed["at"] == booked.lease.acquired_at_ms
        assert int(redis_client.hget(limit.key, "tat")) == counted
    else:
        assert handed is None
        assert int(redis_client.hget(limit.key, "tat")) == counted - 100_000  # given back
