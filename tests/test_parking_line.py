"""End to end, the parking line: the failures of the old waiting line (retired), which
the parking line must not have.

Each test runs real ``celery worker`` processes (prefork, :mod:`parking_app`) on a
private redis-server, on the parking line (one message in a parking queue of the
broker, the lock store keeping references). Bodies count from inside how many of a key
run at once (with their processes' identities, see :mod:`fault_app`) and how many times
each run (or attempt) ran.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, List

import pytest
import redis
from celery.result import AsyncResult
from celery.utils.nodenames import worker_direct
from kombu.serialization import dumps

from celery_redislock.config.settings import read_settings
from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.errors import LockConfigurationError
from celery_redislock.parking import Restored, parking_queue

from cluster_checks import (
    lock_store,
    peaks,
    record_store,
    slots_come_back,
    wait_for_results,
    wait_until,
)
from parking_app import (
    API_PREFIX,
    GATE_ENV,
    KILL_ENV,
    LATE,
    LATE_PREFIX,
    LINE_ENV,
    ONE,
    ONE_PREFIX,
    RABBIT_ENV,
    RECORD,
    SLOT_COUNT,
    SLOTS,
    SLOTS_PREFIX,
    TENANTS,
    UPSTREAM,
    VISIBILITY_ENV,
)
from test_store_loss import restart_lock_store_empty
from test_store_restart import restart_lock_store_with_data

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 30.0

#: The parking line is wired (False while its pieces land: its runs are expected to
#: fail, not required to).
BROKER_LINE_READY = True


def lines(store_fails: bool, always: bool = True) -> List[Any]:
    """The line as a parameter: the parking line (the old line, which got some of these
    wrong, ``store_fails``, is retired)."""
    return [pytest.param("broker", marks=[] if BROKER_LINE_READY else [pytest.mark.xfail(
        strict=False, reason="the parking line is not wired yet")])]


@pytest.fixture
def start_cluster(start_workers: WorkerClusterFactory) -> WorkerClusterFactory:
    """Start workers of :mod:`parking_app` on ``line``, with more environment if given."""
    return lambda line, environment=(), **options: start_workers(
        "parking_app", {LINE_ENV: line, **dict(environment)}, **options)


def run_counts(record: redis.Redis, results: List[AsyncResult]) -> List[int]:
    return [int(record.get(f"runs:{result.id}") or 0) for result in results]


def started(record: redis.Redis) -> int:
    return int(record.hlen("started"))


# --- (a) the limit ---------------------------------------------------------------------

@pytest.mark.parametrize("line", lines(store_fails=False))
def test_peak_never_over_the_limit(start_cluster: Any, line: str) -> None:
    """Three times more pool processes than slots, four times more runs than processes'
    room: never more than the slots at once, each run once."""
    cluster = start_cluster(line)
    record = record_store(cluster)
    task = cluster.app.tasks[SLOTS]
    results = [task.delay(0.2, key="peak") for _ in range(4 * 3 * SLOT_COUNT)]
    wait_for_results(cluster, results)
    print(f"\n{line}: peaks {peaks(record, SLOTS_PREFIX + 'peak')}")
    assert max(peaks(record, SLOTS_PREFIX + "peak")) == SLOT_COUNT
    assert run_counts(record, results) == [1] * len(results)
    assert slots_come_back(cluster, SLOTS_PREFIX + "peak")
    assert_on_line(cluster, line)


def assert_on_line(cluster: WorkerCluster, line: str) -> None:
    """The runs that waited waited on ``line``."""
    logs = cluster.logs()
    assert (" parked: " in logs) == (line == "broker")
    assert " deferred: " not in logs


def test_the_async_gate_parks_too(start_cluster: Any) -> None:
    """The same on the event loop's connection (``redislock_gate = "async"``)."""
    cluster = start_cluster("broker", environment={GATE_ENV: "async"})
    record = record_store(cluster)
    results = [cluster.app.tasks[SLOTS].delay(0.2, key="async") for _ in range(18)]
    wait_for_results(cluster, results)
    assert max(peaks(record, SLOTS_PREFIX + "async")) == SLOT_COUNT
    assert run_counts(record, results) == [1] * len(results)
    assert_on_line(cluster, "broker")


def test_acks_late_runs_park_too(start_cluster: Any) -> None:
    """Runs acknowledged after their body (their references served by the release)."""
    cluster = start_cluster("broker")
    record = record_store(cluster)
    results = [cluster.app.tasks[LATE].delay(0.1, key="late") for _ in range(8)]
    wait_for_results(cluster, results)
    assert max(peaks(record, LATE_PREFIX + "late")) == 1
    assert run_counts(record, results) == [1] * len(results)
    assert_on_line(cluster, "broker")


def test_two_limits_at_once(start_cluster: Any) -> None:
    """A slot per tenant and two over all: a run parks at the first limit that refuses
    it; moved, it asks the others."""
    cluster = start_cluster("broker")
    record = record_store(cluster)
    task = cluster.app.tasks[TENANTS]
    results = [task.delay(0.15, tenant=f"t{n % 3}") for n in range(15)]
    wait_for_results(cluster, results)
    print(f"\npeaks over all {peaks(record, 'tenants')}")
    assert max(peaks(record, "tenants")) == 2
    assert all(max(peaks(record, f"tenant:t{n}")) == 1 for n in range(3))
    assert run_counts(record, results) == [1] * len(results)
    assert_on_line(cluster, "broker")


@pytest.mark.parametrize("line", ["broker"])
def test_hand_off_latency(start_cluster: Any, line: str) -> None:
    """From a body's end to the next waiting run's start, one slot, 12 runs queued."""
    cluster = start_cluster(line)
    record = record_store(cluster)
    results = [cluster.app.tasks[ONE].delay(0.05, key="latency") for _ in range(12)]
    wait_for_results(cluster, results)
    spans = sorted((int(record.hget("started", r.id)), int(record.hget("ended", r.id)))
                   for r in results)
    gaps = sorted((spans[n + 1][0] - spans[n][1]) / 1000 for n in range(len(spans) - 1))
    print(f"\n{line}: hand-off p50 {gaps[len(gaps) // 2]:.1f} ms, "
          f"max {gaps[-1]:.1f} ms ({len(gaps)} hand-offs)")
    assert max(peaks(record, ONE_PREFIX + "latency")) == 1
    assert gaps[len(gaps) // 2] < 250


def test_solo_workers_park_too(start_cluster: Any) -> None:
    """Workers of the solo pool (the body runs in the main process, between turns of
    its event loop)."""
    cluster = start_cluster("broker", workers=3, concurrency=1, pool="solo")
    record = record_store(cluster)
    results = [cluster.app.tasks[SLOTS].delay(0.2, key="solo") for _ in range(12)]
    wait_for_results(cluster, results)
    assert max(peaks(record, SLOTS_PREFIX + "solo")) == SLOT_COUNT
    assert run_counts(record, results) == [1] * len(results)
    assert_on_line(cluster, "broker")


def test_rabbitmq_as_the_broker(start_cluster: Any) -> None:
    """The same with RabbitMQ as the broker (a move: get, publish, acknowledge)."""
    from test_rabbitmq import rabbitmq_answers
    if not rabbitmq_answers():
        pytest.skip("no RabbitMQ answers")
    cluster = start_cluster("broker", environment={RABBIT_ENV: "1"})
    record = record_store(cluster)
    key = f"rabbit-{uuid.uuid4().hex[:8]}"
    try:
        results = [cluster.app.tasks[SLOTS].delay(0.2, key=key) for _ in range(18)]
        wait_for_results(cluster, results)
        assert max(peaks(record, SLOTS_PREFIX + key)) == SLOT_COUNT
        assert run_counts(record, results) == [1] * len(results)
        assert_on_line(cluster, "broker")
    finally:
        with cluster.app.connection_for_write() as connection:
            channel = connection.default_channel
            channel.queue_delete(cluster.app.conf.task_default_queue)
            channel.queue_delete(parking_queue(semaphore_key(SLOTS_PREFIX + key,
                                                             "redislock:")))


def test_a_waiting_copy_of_today_is_parked(start_cluster: Any) -> None:
    """A copy sent back by a worker on today's line (a version 1 wait header, with its
    ticket) that reaches a worker on the parking line is parked there and runs once."""
    cluster = start_cluster("broker", workers=1, concurrency=2)
    record = record_store(cluster)
    task = cluster.app.tasks[ONE]
    holder = task.delay(1.0, key="v1")
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    old = task.apply_async((0.1,), {"key": "v1"}, headers={"redislock_wait": {
        "since": 1, "attempts": 3, "promises": {}, "ticket": "x.0001", "copy": "c1"}})
    wait_for_results(cluster, [holder, old])
    assert f"{old.id}] parked: " in cluster.logs()
    assert run_counts(record, [holder, old]) == [1, 1]
    assert peaks(record, ONE_PREFIX + "v1") == [1, 1]


def test_a_revoked_parked_run_hands_its_slot_on(start_cluster: Any) -> None:
    """A parked run revoked is found so when moved: it leaves the line and the slot it
    was moved for goes to the next at once, not after its reservation's 10 s."""
    cluster = start_cluster("broker", workers=1, concurrency=2)
    record = record_store(cluster)
    task = cluster.app.tasks[ONE]
    holder = task.delay(1.0, key="rev")
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    revoked, after = task.delay(0.1, key="rev"), task.delay(0.1, key="rev")
    wait_until(lambda: record.hlen("refused") >= 2, TIMEOUT, "both to park")
    cluster.app.control.revoke(revoked.id)
    wait_for_results(cluster, [holder, after])
    gap = (int(record.hget("started", after.id)) - int(record.hget("ended", holder.id))) / 1e6
    print(f"\nthe next run started {gap:.3f} s after the holder ended")
    assert not record.exists(f"runs:{revoked.id}")
    assert gap < 3.0


# --- (b), (c) the lock store restarted while runs wait -----------------------------------

def _restarted_while_waiting(start_cluster: Any, line: str,
                             restart: Callable[[WorkerCluster], None], key: str) -> None:
    cluster = start_cluster(line, separate_lock_store=True, concurrency=2)
    record = record_store(cluster)
    task = cluster.app.tasks[SLOTS]
    results = [task.delay(0.5, key=key) for _ in range(10)]
    wait_until(lambda: started(record) >= SLOT_COUNT, TIMEOUT, "the first runs to start")
    restart(cluster)
    wait_for_results(cluster, results)
    counts = run_counts(record, results)
    print(f"\n{line}: runs {counts}, peaks {peaks(record, SLOTS_PREFIX + key)}")
    assert max(peaks(record, SLOTS_PREFIX + key)) <= SLOT_COUNT
    assert counts == [1] * len(results)


@pytest.mark.parametrize("line", lines(store_fails=False))
def test_store_restarted_with_its_data_while_runs_wait(start_cluster: Any, line: str) -> None:
    """Every run runs once; none is lost, none runs twice."""
    _restarted_while_waiting(start_cluster, line, restart_lock_store_with_data, "aof")


@pytest.mark.parametrize("line", lines(store_fails=False))
def test_store_restarted_empty_while_runs_wait(start_cluster: Any, line: str) -> None:
    """No run lost, none run twice (no move was cut by a crash here)."""
    _restarted_while_waiting(start_cluster, line, restart_lock_store_empty, "empty")


# --- (d) the back-pressure pattern -----------------------------------------------------

@pytest.mark.parametrize("line", lines(store_fails=True, always=False))
def test_back_pressure_runs_each_attempt_once(start_cluster: Any, line: str) -> None:
    """README's pattern: an upstream answers 429 to every first attempt, the body pauses
    its key and retries. Each (task id, retries) body runs once. (Today's line ran some
    attempts twice in 4 of 5 runs of this test with 6 tasks.)"""
    cluster = start_cluster(line)
    record = record_store(cluster)
    task = cluster.app.tasks[UPSTREAM]
    results = [task.delay(key="bp") for _ in range(10)]
    wait_for_results(cluster, results)
    attempts = [[int(record.get(f"attempts:{r.id}:{n}") or 0) for n in (0, 1)]
                for r in results]
    print(f"\n{line}: attempts {attempts}, peaks {peaks(record, API_PREFIX + 'bp')}")
    assert attempts == [[1, 1]] * len(results)
    assert max(peaks(record, API_PREFIX + "bp")) == 1
    assert_on_line(cluster, line)  # paused: parked too, never sent back as a copy


# --- (e) nothing in the lock store can become a task -------------------------------------

def _forge(lock: redis.Redis, name: str, task_name: str) -> None:
    """Put a well-formed, unsigned message of ``task_name`` first in the line of ``name``
    in today's layout, as anyone with write access to the lock store could."""
    key = semaphore_key(name, "redislock:")
    message = {"task": task_name, "args": ["forged"], "kwargs": {},
               "options": {"task_id": "forged-id"}, "subtask_type": None, "immutable": False}
    content_type, encoding, body = dumps(message, serializer="json")
    lock.zadd(companion_key(key, "q"), {"evil.0001": 1})
    lock.hset(companion_key(key, "w"), mapping={
        "evil.0001": "{}", "m:evil.0001": f"{content_type}\n{encoding}\ntext\n{body}"})
    lock.zadd(companion_key(key, "x"), {"evil.0001": int(time.time() * 1000) + 600_000})


def _bodies_in(lock: redis.Redis, task_name: str) -> List[bytes]:
    """The lock store's keys whose values name ``task_name`` (a task message's body)."""
    found = []
    for key in lock.scan_iter(count=1000):
        kind = lock.type(key)
        values: List[Any] = []
        if kind == b"hash":
            values = list(lock.hvals(key))
        elif kind == b"string":
            values = [lock.get(key)]
        elif kind == b"list":
            values = lock.lrange(key, 0, -1)
        if any(task_name.encode() in (value or b"") for value in values):
            found.append(key)
    return found


@pytest.mark.parametrize("line", lines(store_fails=True))
def test_nothing_in_the_store_becomes_a_task(start_cluster: Any, line: str) -> None:
    """While runs wait, the lock store holds no task message; an entry forged in today's
    layout is never run."""
    cluster = start_cluster(line, workers=1, concurrency=2)
    record, lock = record_store(cluster), lock_store(cluster)
    task = cluster.app.tasks[ONE]
    results = [task.delay(0.6, key="forge") for _ in range(3)]
    wait_until(lambda: started(record) >= 1 and record.hlen("refused") >= 1, TIMEOUT,
               "a run to hold the slot and another to wait")
    wait_until(lambda: record.hlen("refused") >= 2, TIMEOUT, "both others to wait")
    bodies = _bodies_in(lock, ONE)
    assert bodies == [], f"task messages kept in the lock store: {bodies}"
    _forge(lock, ONE_PREFIX + "forge", RECORD)
    wait_for_results(cluster, results)
    marker = cluster.app.tasks[RECORD].delay("marker")
    assert marker.get(timeout=TIMEOUT) == "marker"
    print(f"\n{line}: recorded {record.lrange('forged', 0, -1)}")
    assert record.lrange("forged", 0, -1) == ["marker"], "the forged entry ran"


# --- (f) a worker killed between the parked copy and the original's acknowledgement ----

@pytest.mark.parametrize("line", lines(store_fails=True))
def test_killed_between_the_copy_and_the_ack(start_cluster: Any, line: str) -> None:
    """Worker 1 publishes a refused run's waiting (parked) copy and is SIGKILLed before it
    acknowledges the original; the broker gives the original back after its visibility
    timeout: the run runs once."""
    cluster = start_cluster(line, concurrency=1, environment={
        KILL_ENV: "worker1", VISIBILITY_ENV: "3"})
    record, broker = record_store(cluster), _broker(cluster)
    task = cluster.app.tasks[ONE]
    nodes = _nodes(cluster)
    holder = task.apply_async((2.0,), {"key": "kill"}, queue=worker_direct(nodes["worker2"]))
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    refused = task.apply_async((0.2,), {"key": "kill"}, queue=worker_direct(nodes["worker1"]))
    worker1 = cluster.worker("worker1")
    wait_until(lambda: worker1.returncode is not None, TIMEOUT, "worker1 to be killed")
    assert record.get("killed") == refused.id
    cluster.restart_worker("worker1")
    wait_until(lambda: record.exists(f"runs:{refused.id}"), TIMEOUT, "the run to run")
    _give_back_unacknowledged(cluster, broker)
    marker = task.apply_async((0.01,), {"key": "kill"}, queue=worker_direct(nodes["worker1"]))
    wait_for_results(cluster, [holder, marker])
    wait_until(lambda: broker.hlen("unacked") == 0, TIMEOUT, "nothing left unacknowledged")
    print(f"\n{line}: the killed run ran {record.get(f'runs:{refused.id}')} time(s)")
    assert int(record.get(f"runs:{refused.id}")) == 1
    assert max(peaks(record, ONE_PREFIX + "kill")) == 1


def _broker(cluster: WorkerCluster) -> redis.Redis:
    assert cluster.urls is not None
    return redis.Redis.from_url(cluster.urls.broker)


def _nodes(cluster: WorkerCluster) -> dict:
    replies = cluster.app.control.ping(timeout=1.0) or []
    return {node.split("@", 1)[0]: node for reply in replies for node in reply}


def _give_back_unacknowledged(cluster: WorkerCluster, broker: redis.Redis) -> None:
    """What the broker does once the killed worker's deliveries are older than the
    visibility timeout (kombu's Redis transport restores them from its unacknowledged
    hash), done now rather than at the next restore cycle (every 10 s)."""
    visibility = float(cluster.app.conf.broker_transport_options["visibility_timeout"])
    wait_until(lambda: all(score < time.time() - visibility for _, score in
                           broker.zrange("unacked_index", 0, -1, withscores=True)),
               TIMEOUT, "the deliveries to outlive the visibility timeout")
    with cluster.app.connection_for_write() as connection:
        connection.default_channel.qos.restore_visible(num=100, interval=1)


# --- the setting -------------------------------------------------------------------------

def test_the_setting_is_checked() -> None:
    app = create_app_conf(redislock_line="broker")
    assert read_settings(app).line == "broker"
    assert read_settings(create_app_conf()).line == "broker"  # the default
    assert read_settings(create_app_conf(redislock_line="store")).line == "broker"  # retired
    with pytest.raises(LockConfigurationError, match="redislock_line"):
        read_settings(create_app_conf(redislock_line="queue"))


def create_app_conf(**conf: Any) -> Any:
    from celery import Celery
    app = Celery("line", set_as_current=False)
    app.conf.update(redislock_url="redis://127.0.0.1:1/0", **conf)
    return app


def test_every_run_parks_from_a_process_that_can(
        caplog: pytest.LogCaptureFixture) -> None:
    """Every run parks (a cost above 1, a max wait of slots or of a rate); without an
    event loop, from the process that runs it (see test_parking_parity_cluster.py for
    the one run that keeps today's line: limits in several slots of a Redis Cluster)."""
    from celery_redislock.engine.admission import RateLimit, SlotLimit
    from celery_redislock.engine.rate import Rate
    from celery_redislock.line import broker_line

    settings = read_settings(create_app_conf(redislock_line="broker"))
    client = redis.Redis()  # never connected: the choice asks nothing
    one, heavy = [SlotLimit("k", 2, "redislock:")], [SlotLimit("k", 4, "redislock:", cost=2)]
    rated = [RateLimit("k", Rate.parse("1/s"), "redislock:")]
    assert broker_line.parks(settings, client, one, loop=True, task_name="t.light")
    with caplog.at_level("WARNING"):
        for _ in range(3):
            assert broker_line.parks(settings, client, heavy, loop=True,  # parked_cost.lua
                                     task_name="t.heavy")
            assert not broker_line.parks(settings, client, one, loop=False,
                                         task_name="t.threads")
            assert broker_line.parks(settings, client, one, loop=True,  # kept: parked_deadline
                                     task_name="t.deadline", max_wait=30.0)
            assert broker_line.parks(settings, client, rated, loop=True,  # deadline.lua
                                     task_name="t.rate_deadline", max_wait=30.0)
    said = [r.getMessage() for r in caplog.records if "cannot park its runs" in r.getMessage()]
    assert said == []  # without an event loop the process that runs it parks it


class _Request:
    """What the gate's park step reads of a worker's request."""

    def __init__(self) -> None:
        self.id, self.task, self.message = "t1", type("T", (), {"name": "n", "app": None}), None
        self.done: List[str] = []

    def acknowledge(self) -> None:
        self.done.append("ack")

    def reject(self, requeue: bool = False) -> None:
        self.done.append(f"reject requeue={requeue}")


@pytest.mark.parametrize("taken, published, after", [
    (True, True, ["ack"]),
    (True, False, ["reject requeue=True"]),
    (False, None, ["reject requeue=True"]),
])
def test_the_original_is_acknowledged_only_once_its_copy_is_parked(
        monkeypatch: pytest.MonkeyPatch, taken: bool, published: Any, after: List[str]) -> None:
    """The gate's park step: the mover publishes the copy, and only then, on the event
    loop, is the original acknowledged; a copy not published (the mover full, or the
    publish failed) sends the original back to its queue (one broker operation)."""
    from kombu.asynchronous import Hub

    from celery_redislock.engine.admission import ParkRef
    from celery_redislock.gate import main_process
    from celery_redislock.line import moves
    from celery_redislock.line.waiting import Parked
    from celery_redislock.parking import Done, Outcome
    from celery_redislock.run.waiting_run import WaitingRun

    jobs: List[Any] = []
    monkeypatch.setattr(moves, "park", lambda app, message, ref, wait, on_done:
                        jobs.append(on_done) or taken)
    hub, request = Hub(), _Request()
    parked = Parked(ParkRef("k", "1:1"), WaitingRun(attempts=1, park_id="1:1", line="k"), "k")
    main_process.park(type("Consumer", (), {"hub": hub})(), request, parked)
    assert request.done == ([] if taken else after)  # nothing before the publish
    if taken:
        outcome = Outcome(True, "parked") if published else None
        jobs[0](Done("park", "j", "q", outcome, None if published else OSError("down")))
        assert request.done == []  # on the mover's thread: not yet
        hub.run_once()
        assert request.done == after
    moves.hop(hub).close()


class _Broker:
    """A broker whose registry knows one parking queue, holding one message."""

    def __init__(self, key: str) -> None:
        self.key = key

    def registry(self, max_age: float = 0.0) -> dict:
        return {parking_queue(self.key): self.key}

    def lengths(self, queues: Any) -> dict:
        return {queue: 1 if queue == parking_queue(self.key) else 0 for queue in queues}

    def restore(self, limit: int = 0, consumed: Any = ()) -> Restored:
        return Restored()


def test_the_poll_hands_over_a_slot_freed_without_a_release(
        redis_client: redis.Redis, redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder's lease runs out (no release comes): the next poll of a worker owes the
    parked run's move; a move that finds the parking queue empty gives the slot back."""
    from celery_redislock.engine import parking as store
    from celery_redislock.engine.admission import Busy, ParkedMove, SlotLimit
    from celery_redislock.line import moves, poll
    from celery_redislock.parking import Done, Outcome

    app = create_app_conf(redislock_line="broker")
    app.conf.redislock_url = redis_server.url
    limit = [SlotLimit("poll", 1, "redislock:")]
    held = store.park_admit(redis_client, limit, lease=0.3, run="a:0")
    refused = store.park_admit(redis_client, limit, lease=30, run="b:0")
    assert isinstance(refused, Busy) and refused.park is not None
    owed: List[Any] = []
    monkeypatch.setattr(moves, "owe", lambda app, found: owed.extend(found))
    the_poll = poll.Poll(app)
    wait_until(lambda: the_poll.once(_Broker(limit[0].key)), 5.0, "a move owed")
    assert owed == [ParkedMove(limit[0].key)] and not held.release()
    given_back: List[str] = []
    monkeypatch.setattr(store, "moved_nothing",
                        lambda client, key, sub="", reserved=True: given_back.append(key))
    moves._moved(app, limit[0].key, False, Done("move", "j", "q", Outcome(False, "empty")))
    assert given_back == [limit[0].key]
