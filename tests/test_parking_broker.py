"""The broker side of the parking line (``celery_redislock.parking``): parked
copies, moves, lengths and the registry on a private Redis broker and on the shared
RabbitMQ, the mover thread, and a moved run retried by a real ``celery worker``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, List, Optional

import kombu
import pytest
from celery import Celery

from celery_redislock.parking import (
    REGISTRY,
    ROUTE_HEADER,
    Done,
    Mover,
    ParkedCopy,
    broker_for,
    moved_copy,
    parked_lengths,
    parking_queue,
    recount,
)
from celery_redislock.parking.naming import WAIT_HEADER, is_parking_queue

from redis_process import RedisServer
from support import wait_until

AMQP_URL = os.environ.get("REDISLOCK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
TESTS_DIRECTORY = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_app(server: RedisServer) -> Iterator[Celery]:
    """A Celery app whose broker is database 5 of the module's own redis-server, emptied."""
    client = server.client(db=5)
    client.flushdb()
    app = make_app(server.database_url(5))
    yield app
    client.close()


def make_app(broker: str, queue: str = "work") -> Celery:
    app = Celery("parking_broker_test", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    task_ignore_result=True)

    app.task(name="parking.noop", bind=True)(_noop)
    return app


def _noop(self: Any, value: Any) -> Any:
    return value


def receive(app: Celery, queue: str, timeout: float = 5.0) -> kombu.Message:
    """The next message of ``queue``, received as a Celery worker receives it (a kombu
    consumer; the message is acknowledged)."""
    got: List[kombu.Message] = []
    with app.connection_for_read() as connection:
        consumer = kombu.Consumer(connection, [kombu.Queue(queue, routing_key=queue)],
                                  accept=["json"], on_message=got.append, prefetch_count=1)
        with consumer:
            deadline = time.monotonic() + timeout
            while not got:
                with contextlib.suppress(TimeoutError):  # nothing yet
                    connection.drain_events(timeout=max(0.05, deadline - time.monotonic()))
                if not got and time.monotonic() > deadline:
                    raise AssertionError(f"nothing arrived in {queue!r}")
        got[0].ack()
    return got[0]


def send(app: Celery, value: Any, queue: Optional[str] = None, **options: Any) -> str:
    return app.tasks["parking.noop"].apply_async((value,), queue=queue, **options).id


def task_value(message: kombu.Message) -> Any:
    args, _kwargs, _embed = message.decode()
    return args[0]


WAIT = {"v": 2, "park_id": "p-1", "line": "k"}


# ---- naming -------------------------------------------------------------------------

def test_parking_queue_names_are_short_safe_and_deterministic() -> None:
    names = {parking_queue(f"redislock:{{{i}}}:s:key") for i in range(1000)}
    assert len(names) == 1000
    name = parking_queue("redislock:{x}:s:a key with spaces and ünïcode")
    assert name == parking_queue("redislock:{x}:s:a key with spaces and ünïcode")
    assert len(name) == 42 and name.isascii() and " " not in name
    assert is_parking_queue(name) and not is_parking_queue(REGISTRY)


# ---- Redis broker -------------------------------------------------------------------

def test_redis_park_then_move_puts_the_same_message_first(redis_app: Celery,
                                                          server: RedisServer) -> None:
    key = "redislock:{t}:s:front"
    parked_id = send(redis_app, "parked", priority=0)
    original = receive(redis_app, "work")
    send(redis_app, "queued-1")
    send(redis_app, "queued-2")
    copy = ParkedCopy.of(original, key, WAIT)
    with redis_app.connection_for_write() as connection:
        broker = broker_for(connection)
        assert broker.park(copy, "job-park").what == "parked"
        assert broker.lengths([copy.queue, parking_queue("other")]) == {
            copy.queue: 1, parking_queue("other"): 0}
        assert broker.registry() == {copy.queue: key}
        assert parked_lengths(broker, [key]) == recount(broker) == {key: 1}
        outcome = broker.move(copy.queue, "job-move")
    assert (outcome.done, outcome.what, outcome.target) == (True, "moved", "work")
    moved = receive(redis_app, "work")
    assert moved.headers["id"] == parked_id and task_value(moved) == "parked"
    move = moved.headers[WAIT_HEADER].pop("move")  # its id, written when parked
    assert moved.headers[WAIT_HEADER] == WAIT and isinstance(move, str) and move
    assert moved_copy(moved.headers) and not moved_copy(original.headers)
    assert moved.headers["task"] == original.headers["task"]
    assert {k: v for k, v in moved.headers.items() if k not in (WAIT_HEADER, ROUTE_HEADER)} \
        == {k: v for k, v in original.headers.items() if k != WAIT_HEADER}
    for name in ("priority", "correlation_id", "reply_to", "delivery_mode"):
        assert moved.properties.get(name) == original.properties.get(name), name
    assert moved.delivery_info["exchange"] == original.delivery_info["exchange"]
    assert moved.delivery_info["routing_key"] == original.delivery_info["routing_key"]
    assert moved.delivery_tag != original.delivery_tag
    assert (moved.content_type, moved.content_encoding) == (
        original.content_type, original.content_encoding)
    assert [task_value(receive(redis_app, "work")) for _ in range(2)] == [
        "queued-1", "queued-2"]
    client = server.client(db=5)
    assert client.llen(copy.queue) == 0 and client.hlen("unacked") == 0
    assert client.hlen(REGISTRY) == 1
    with redis_app.connection_for_write() as connection:
        assert broker_for(connection).registry() == {}  # empty: forgotten
    assert client.hlen(REGISTRY) == 0
    client.close()


def test_redis_move_of_an_empty_parking_queue_returns_false(redis_app: Celery) -> None:
    with redis_app.connection_for_write() as connection:
        outcome = broker_for(connection).move(parking_queue("nobody"), "j")
    assert (outcome.done, outcome.what) == (False, "empty")


def test_redis_priority_lists_are_respected(redis_app: Celery, server: RedisServer) -> None:
    """A run sent with a priority is moved to its queue's list for that priority step
    (kombu's ``_q_for_pri``), and the worker's BRPOP over the steps takes it in turn."""
    send(redis_app, "urgent", priority=5)
    original = receive(redis_app, "work")
    assert original.properties["priority"] == 5
    copy = ParkedCopy.of(original, "redislock:{t}:s:prio", WAIT)
    with redis_app.connection_for_write() as connection:
        broker = broker_for(connection)
        broker.park(copy, "p")
        outcome = broker.move(copy.queue, "m")
    assert outcome.target == "work\x06\x163"
    client = server.client(db=5)
    assert client.llen("work\x06\x163") == 1 and client.llen("work") == 0
    client.close()
    moved = receive(redis_app, "work")
    assert moved.properties["priority"] == 5 and task_value(moved) == "urgent"


def test_redis_parks_and_moves_in_order_and_a_retried_job_happens_once(
        redis_app: Celery) -> None:
    key = "redislock:{t}:s:order"
    for index in range(3):
        send(redis_app, index)
    copies = [ParkedCopy.of(receive(redis_app, "work"), key, WAIT) for _ in range(3)]
    with redis_app.connection_for_write() as connection:
        broker = broker_for(connection)
        for index, copy in enumerate(copies):
            assert broker.park(copy, f"park-{index}").what == "parked"
        assert broker.park(copies[0], "park-0").what == "parked before"
        assert broker.lengths([copies[0].queue]) == {copies[0].queue: 3}
        assert broker.move(copies[0].queue, "move-0").what == "moved"
        again = broker.move(copies[0].queue, "move-0")
        assert (again.done, again.what) == (True, "moved before")
        assert broker.lengths([copies[0].queue]) == {copies[0].queue: 2}
        assert task_value(receive(redis_app, "work")) == 0  # the oldest parked first
        assert broker.move(copies[0].queue, "move-1").done
        assert broker.move(copies[0].queue, "move-2").done
    # each move goes to the front: moves made before any is taken are taken last first
    assert [task_value(receive(redis_app, "work")) for _ in range(2)] == [2, 1]


def test_redis_exchange_routing_and_global_prefix(server: RedisServer) -> None:
    """A task routed through a direct exchange to a queue of another name goes back to
    that queue; the transport's ``global_keyprefix`` is applied to every key."""
    client = server.client(db=6)
    client.flushdb()
    app = make_app(server.database_url(6))
    app.conf.broker_transport_options = {"global_keyprefix": "pfx:"}
    app.conf.task_queues = [kombu.Queue("reports", kombu.Exchange("jobs", type="direct"),
                                        routing_key="report.daily")]
    app.conf.task_routes = {"parking.noop": {"exchange": "jobs",
                                             "routing_key": "report.daily"}}
    with app.connection_for_write() as connection:  # declares the queue and its binding
        kombu.Queue("reports", kombu.Exchange("jobs", type="direct"),
                    routing_key="report.daily")(connection.default_channel).declare()
    send(app, "routed")
    original = receive(app, "reports")
    assert original.delivery_info["exchange"] == "jobs"
    copy = ParkedCopy.of(original, "redislock:{t}:s:routed", WAIT)
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        broker.park(copy, "p")
        assert client.llen("pfx:" + copy.queue) == 1
        assert broker.registry() == {copy.queue: "redislock:{t}:s:routed"}
        assert broker.move(copy.queue, "m").target == "reports"
    moved = receive(app, "reports")
    assert moved.delivery_info["routing_key"] == "report.daily"
    assert task_value(moved) == "routed"
    done: List[Done] = []  # the mover's own connection keeps the transport's options
    mover = Mover.for_app(app).start()
    assert mover.park(copy, done.append) and mover.move(copy.queue, done.append)
    wait_until(lambda: len(done) == 2, what="a park and a move")
    assert mover.stop()
    assert [d.outcome.target for d in done if d.outcome] == ["", "reports"]
    assert task_value(receive(app, "reports")) == "routed"
    assert client.keys("pfx:redislock.parking.done.*")  # the jobs' markers, prefixed
    assert [key for key in client.keys("*") if not key.startswith(b"pfx:")] == []
    assert client.hlen("pfx:" + REGISTRY) == 1  # its queue emptied: forgotten when read
    with app.connection_for_write() as connection:
        assert broker_for(connection).registry() == {}
    assert client.exists("pfx:" + REGISTRY) == 0
    client.close()


def test_redis_queue_names_json_escapes_are_moved_too(redis_app: Celery,
                                                     server: RedisServer) -> None:
    """move.lua reads the target without decoding the message, and decodes it when the
    queue's name has characters JSON escapes (here non-ASCII, at a priority step)."""
    queue = "wörk-\"quoted\""
    send(redis_app, "escaped", queue=queue, priority=7)
    copy = ParkedCopy.of(receive(redis_app, queue), "redislock:{t}:s:escaped", WAIT)
    with redis_app.connection_for_write() as connection:
        broker = broker_for(connection)
        broker.park(copy, "p")
        assert broker.move(copy.queue, "m").target == queue + "\x06\x166"
    assert task_value(receive(redis_app, queue)) == "escaped"


def test_redis_unroutable_head_is_set_aside(redis_app: Celery, server: RedisServer) -> None:
    queue = parking_queue("redislock:{t}:s:junk")
    client = server.client(db=5)
    client.lpush(queue, b"not json")
    with redis_app.connection_for_write() as connection:
        outcome = broker_for(connection).move(queue, "m")
    assert (outcome.done, outcome.what) == (False, "unroutable")
    assert client.lrange("redislock.parking.unroutable", 0, -1) == [b"not json"]
    client.close()


# ---- the mover thread ---------------------------------------------------------------

def test_mover_does_jobs_in_order_and_reports_each_once(redis_app: Celery) -> None:
    key = "redislock:{t}:s:mover"
    for index in range(3):
        send(redis_app, index)
    copies = [ParkedCopy.of(receive(redis_app, "work"), key, WAIT) for _ in range(3)]
    done: List[Done] = []
    threads = set()

    def on_done(result: Done) -> None:
        threads.add(threading.current_thread().name)
        done.append(result)

    mover = Mover.for_app(redis_app).start()
    try:
        for copy in copies:
            assert mover.park(copy, on_done)
        for _ in range(4):
            assert mover.move(copies[0].queue, on_done)
        wait_until(lambda: len(done) == 7, what="seven jobs done")
    finally:
        assert mover.stop()
    assert [(d.kind, d.outcome.what if d.outcome else None) for d in done] == [
        ("park", "parked")] * 3 + [("move", "moved")] * 3 + [("move", "empty")]
    assert [d.copy for d in done[:3]] == copies
    assert threads == {"redislock-mover"}
    assert [task_value(receive(redis_app, "work")) for _ in range(3)] == [2, 1, 0]
    assert not mover.move(copies[0].queue, on_done)  # stopped: not taken


def test_mover_queue_is_bounded_and_a_failing_callback_does_not_stop_it(
        redis_app: Celery) -> None:
    gate = threading.Event()
    done: List[Done] = []

    def slow(result: Done) -> None:
        gate.wait(10)
        raise RuntimeError("a callback that fails")

    mover = Mover.for_app(redis_app, max_jobs=2).start()
    try:
        queue = parking_queue("redislock:{t}:s:bounded")
        assert mover.move(queue, slow)  # taken by the thread, which waits in the callback
        wait_until(lambda: mover.pending == 0, what="the first job taken")
        assert mover.move(queue, done.append) and mover.move(queue, done.append)
        assert not mover.move(queue, done.append)  # full
        gate.set()
        wait_until(lambda: len(done) == 2, what="the jobs after the failing callback")
    finally:
        assert mover.stop()


def test_mover_reconnects_and_does_the_job_once(tmp_path: Path) -> None:
    """The broker goes away with a park and a move waiting: both are done once it is
    back, on a new connection, each once."""
    own = RedisServer().start()
    try:
        app = make_app(own.database_url(0))
        send(app, "survives")
        copy = ParkedCopy.of(receive(app, "work"), "redislock:{t}:s:reconnect", WAIT)
        done: List[Done] = []
        mover = Mover.for_app(app, retry_delay=0.1).start()
        assert mover.move(copy.queue, done.append)
        wait_until(lambda: len(done) == 1, what="a first move")
        own.stop()
        assert mover.park(copy, done.append) and mover.move(copy.queue, done.append)
        time.sleep(0.5)  # let the mover fail a few times against the stopped server
        assert len(done) == 1
        own.start()
        wait_until(lambda: len(done) == 3, timeout=30, what="the jobs after the restart")
        assert mover.stop()
        assert [d.outcome.what for d in done if d.outcome] == ["empty", "parked", "moved"]
        assert done[1].attempts > 1
        assert task_value(receive(app, "work")) == "survives"
        client = own.client()
        assert client.llen(copy.queue) == 0 and client.llen("work") == 0
        client.close()
    finally:
        own.cleanup()


def test_mover_stop_gives_up_on_a_broker_that_does_not_come_back() -> None:
    own = RedisServer().start()
    try:
        app = make_app(own.database_url(0))
        own.stop()
        done: List[Done] = []
        mover = Mover.for_app(app, retry_delay=0.05).start()
        assert mover.move(parking_queue("k"), done.append)
        assert mover.move(parking_queue("k"), done.append)
        assert mover.stop(timeout=0.5)
        assert [type(d.error).__name__ for d in done] == ["Cancelled", "Cancelled"]
    finally:
        own.cleanup()


# ---- RabbitMQ -----------------------------------------------------------------------

def rabbitmq_answers() -> bool:
    try:
        with kombu.Connection(AMQP_URL, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


@pytest.fixture
def rabbit_app() -> Iterator[Celery]:
    """A Celery app on the shared RabbitMQ with a queue (and exchange) of its own; the
    test's queues are deleted after it (``app.parking_queues``: those it parked into)."""
    if not rabbitmq_answers():
        pytest.skip(f"no RabbitMQ answers at {AMQP_URL}")
    queue = f"redislock-test-park-{uuid.uuid4().hex[:10]}"
    app = make_app(AMQP_URL, queue)
    app.conf.update(task_queues=[kombu.Queue(queue, kombu.Exchange(queue, "direct"),
                                             routing_key="parking.rk")],
                    task_default_exchange=queue, task_default_routing_key="parking.rk")
    app.parking_queues = []  # type: ignore[attr-defined]
    yield app
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        for name in [queue, *app.parking_queues]:  # type: ignore[attr-defined]
            channel.queue_delete(name)
        channel.exchange_delete(queue)


def test_rabbitmq_park_then_move_returns_the_same_message(rabbit_app: Celery) -> None:
    queue = rabbit_app.conf.task_default_queue
    key = f"redislock:{{t}}:s:{queue}"
    with rabbit_app.connection_for_write() as connection:
        rabbit_app.conf.task_queues[0](connection.default_channel).declare()
    # through the exchange (Celery sends to a direct queue by the default exchange)
    parked_id = send(rabbit_app, "parked", priority=5, exchange=queue,
                     routing_key="parking.rk")
    original = receive(rabbit_app, queue)
    send(rabbit_app, "queued")
    copy = ParkedCopy.of(original, key, WAIT)
    rabbit_app.parking_queues.append(copy.queue)  # type: ignore[attr-defined]
    with rabbit_app.connection_for_write() as connection:
        broker = broker_for(connection)
        assert broker.park(copy, "p").what == "parked"
        wait_until(lambda: broker.lengths([copy.queue]) == {copy.queue: 1},
                   what="the parked copy counted")
        assert broker.registry().get(copy.queue) == key
        outcome = broker.move(copy.queue, "m")
        assert (outcome.done, outcome.what) == (True, "moved")
        assert outcome.target == f"{queue}/parking.rk"
        assert broker.move(copy.queue, "m2").what == "empty"
        assert broker.lengths([copy.queue, parking_queue("none")]) == {
            copy.queue: 0, parking_queue("none"): 0}
    assert task_value(receive(rabbit_app, queue)) == "queued"  # AMQP: behind the queue
    moved = receive(rabbit_app, queue)
    assert moved.headers["id"] == parked_id and task_value(moved) == "parked"
    assert moved.headers[WAIT_HEADER] == {**WAIT, "move": "m"}  # its id: the move's
    assert moved_copy(moved.headers)
    assert not moved_copy(original.headers)
    assert {k: v for k, v in moved.headers.items() if k not in (WAIT_HEADER, ROUTE_HEADER)} \
        == {k: v for k, v in original.headers.items() if k != WAIT_HEADER}
    for name in ("priority", "correlation_id", "reply_to", "delivery_mode"):
        assert moved.properties.get(name) == original.properties.get(name), name
    assert moved.properties["priority"] == 5
    assert moved.delivery_info["exchange"] == original.delivery_info["exchange"] == queue
    assert original.delivery_info["routing_key"] == "parking.rk"
    assert moved.delivery_info["routing_key"] == original.delivery_info["routing_key"]
    assert (moved.content_type, moved.content_encoding) == (
        original.content_type, original.content_encoding)
    with rabbit_app.connection_for_write() as connection:
        connection.default_channel.queue_delete(copy.queue)
        assert copy.queue not in broker_for(connection).registry()
        assert broker_for(connection) is broker_for(connection)


def test_rabbitmq_mover_parks_and_moves_in_order(rabbit_app: Celery) -> None:
    queue = rabbit_app.conf.task_default_queue
    with rabbit_app.connection_for_write() as connection:
        rabbit_app.conf.task_queues[0](connection.default_channel).declare()
    for index in range(3):
        send(rabbit_app, index)
    copies = [ParkedCopy.of(receive(rabbit_app, queue), f"redislock:{{t}}:s:{queue}", WAIT)
              for _ in range(3)]
    rabbit_app.parking_queues.append(copies[0].queue)  # type: ignore[attr-defined]
    done: List[Done] = []
    mover = Mover.for_app(rabbit_app).start()
    try:
        for copy in copies:
            assert mover.park(copy, done.append)
        for _ in range(4):
            assert mover.move(copies[0].queue, done.append)
        wait_until(lambda: len(done) == 7, what="seven jobs done")
    finally:
        assert mover.stop()
    assert [(d.kind, d.outcome.what if d.outcome else d.error) for d in done] == [
        ("park", "parked")] * 3 + [("move", "moved")] * 3 + [("move", "empty")]
    assert [task_value(receive(rabbit_app, queue)) for _ in range(3)] == [0, 1, 2]


# ---- a real worker ------------------------------------------------------------------

@pytest.mark.parametrize("broker_kind", ["redis", "amqp"])
def test_a_moved_run_retries_to_its_original_queue(broker_kind: str, server: RedisServer,
                                                   tmp_path: Path) -> None:
    """A run parked, then moved back, is taken by a real ``celery worker``; its
    ``self.retry()`` goes through the original exchange and routing key to the original
    queue, where the worker runs it again (``retries`` 1); the retry carries the parked
    copy's headers, and :func:`moved_copy` tells it from the moved copy."""
    import parking_broker_app

    record = server.client(db=8)
    record.flushdb()
    queue = f"parking-reports-{uuid.uuid4().hex[:8]}"
    if broker_kind == "redis":
        server.client(db=7).flushdb()
        broker_url = server.database_url(7)
    else:
        if not rabbitmq_answers():
            pytest.skip(f"no RabbitMQ answers at {AMQP_URL}")
        broker_url = AMQP_URL
    app = parking_broker_app.create_app(broker_url, queue)
    key = f"redislock:{{t}}:s:{queue}"
    worker: Optional[subprocess.Popen[bytes]] = None
    log_path = tmp_path / "worker.log"
    try:
        with app.connection_for_write() as connection:
            app.conf.task_queues[0](connection.default_channel).declare()
        task_id = app.tasks["parking.retry_once"].delay(server.database_url(8)).id
        original = receive(app, queue)
        assert original.delivery_info["routing_key"] == parking_broker_app.ROUTING_KEY
        copy = ParkedCopy.of(original, key, WAIT)
        with app.connection_for_write() as connection:
            assert broker_for(connection).park(copy, "p").done
        env = {**os.environ, "PARKING_BROKER_URL": broker_url, "PARKING_QUEUE": queue}
        with log_path.open("wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "parking_broker_app", "worker",
                 "-P", "solo", "-Q", queue, "-l", "info", "-n", f"{queue}@%h",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=TESTS_DIRECTORY, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_until(lambda: "ready." in log_path.read_text(errors="replace"), timeout=30,
                   what="the worker ready")
        assert record.llen("runs") == 0  # parked: nobody runs it
        with app.connection_for_write() as connection:
            assert broker_for(connection).move(copy.queue, "m").done
        wait_until(lambda: record.llen("runs") >= 2, timeout=30, what="the run and its retry")
        time.sleep(0.3)  # a third run, if any, would show now
        runs = [json.loads(item) for item in record.lrange("runs", 0, -1)]
        assert [run["retries"] for run in runs] == [0, 1], log_path.read_text()
        assert {run["id"] for run in runs} == {task_id}
        for run in runs:
            assert (run["exchange"], run["routing_key"]) == (
                f"{queue}-exchange", parking_broker_app.ROUTING_KEY), run
        # Celery copies the moved copy's headers into its retry: only the attempt tells
        # the retry (a new attempt, never parked) from the moved copy
        assert [run["wait"] for run in runs] == [{**WAIT, "move": runs[0]["wait"]["move"]}] * 2
        assert [run["moved_copy"] for run in runs] == [True, False]
        with app.connection_for_write() as connection:
            assert broker_for(connection).lengths([copy.queue]) == {copy.queue: 0}
    finally:
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)
        if broker_kind == "amqp":
            with app.connection_for_write() as connection:
                channel = connection.default_channel
                for name in (queue, copy.queue if "copy" in locals() else ""):
                    if name:
                        channel.queue_delete(name)
                channel.exchange_delete(f"{queue}-exchange")
        record.close()


# ---- the hop to the event loop, and the mover's retries (a broker that fails) --------

def test_loop_hop_runs_other_threads_calls_on_the_loop_in_order() -> None:
    from kombu.asynchronous import Hub

    from celery_redislock.parking import LoopHop

    hub = Hub()
    hop = LoopHop(hub)
    seen: List[Any] = []
    loop_thread = threading.current_thread()
    on_done = hop.on_loop(lambda n: seen.append((n, threading.current_thread())))
    senders = [threading.Thread(target=lambda base=base: [on_done(base + i)
                                                          for i in range(500)])
               for base in (0, 1000)]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 10
    while len(seen) < 1000 and time.monotonic() < deadline:
        hub.run_once()
    for sender in senders:
        sender.join()
    hop.close()
    assert len(seen) == 1000 and {thread for _, thread in seen} == {loop_thread}
    for base in (0, 1000):
        assert [n for n, _ in seen if base <= n < base + 1000] == list(range(base, base + 500))


class FlakyConnection:
    connection_errors = (ConnectionError,)

    def ensure_connection(self, **_: Any) -> None:
        pass

    def collect(self) -> None:
        pass


class FlakyBroker:
    """Fails each job's first try, after (``sent``) or before its publish."""

    def __init__(self, sent: bool) -> None:
        self.sent_on_failure = sent
        self.tries: List[str] = []

    def _try(self, what: str) -> None:
        self.tries.append(what)
        if self.tries.count(what) == 1:
            self.sent = self.sent_on_failure
            raise ConnectionError("connection lost")
        self.sent = True

    def park(self, copy: ParkedCopy, job_id: str) -> Any:
        self._try("park " + job_id)
        from celery_redislock.parking import Outcome
        return Outcome(True, "parked")

    def move(self, queue: str, job_id: str) -> Any:
        self._try("move " + job_id)
        from celery_redislock.parking import Outcome
        return Outcome(True, "moved")


@pytest.mark.parametrize("sent", [False, True])
def test_mover_retries_and_reports_doubt(sent: bool) -> None:
    """A connection lost before the publish: the job is retried, without doubt. Lost
    after it (RabbitMQ): a park is retried and reported in doubt (two copies may
    exist); a move is not retried (its message may be at its target already) and is
    reported moved, in doubt."""
    broker = FlakyBroker(sent)
    done: List[Done] = []
    mover = Mover(FlakyConnection, retry_delay=0.01, broker=lambda _: broker).start()
    copy = ParkedCopy(key="k", queue=parking_queue("k"), body=b"{}",
                      content_type="application/json", content_encoding="utf-8", headers={})
    assert mover.park(copy, done.append) and mover.move(copy.queue, done.append)
    wait_until(lambda: len(done) == 2, what="both jobs")
    assert mover.stop()
    park, move = done
    assert park.attempts == 2 and park.outcome is not None
    assert (park.outcome.what, park.outcome.doubt) == ("parked", sent)
    assert move.outcome is not None and move.outcome.done
    assert (move.attempts, move.outcome.doubt) == ((1, True) if sent else (2, False))


def test_rabbitmq_registry_keeps_one_entry_per_queue(rabbit_app: Celery) -> None:
    """Each connection registers a parking queue the first time it parks there; the
    registry read answers each queue once, drops the duplicates and the entries of
    queues deleted since, and gives back the rest for the next read."""
    queue = rabbit_app.conf.task_default_queue
    with rabbit_app.connection_for_write() as connection:
        rabbit_app.conf.task_queues[0](connection.default_channel).declare()
    send(rabbit_app, "registered")
    key = f"redislock:{{t}}:s:{queue}"
    copy = ParkedCopy.of(receive(rabbit_app, queue), key, WAIT)
    gone = ParkedCopy.of(receive_after_send(rabbit_app, queue), key + ":gone", WAIT)
    rabbit_app.parking_queues += [copy.queue, gone.queue]  # type: ignore[attr-defined]
    for _ in range(2):  # two connections: two entries of copy.queue
        with rabbit_app.connection_for_write() as connection:
            broker = broker_for(connection)
            broker.park(copy, "p")
            broker.park(gone, "g")
    with rabbit_app.connection_for_write() as connection:
        broker = broker_for(connection)
        assert broker.lengths([copy.queue]) == {copy.queue: 2}
        connection.default_channel.queue_delete(gone.queue)
        first = broker.registry(max_age=0)
        assert first.get(copy.queue) == key and gone.queue not in first
        assert broker.registry(max_age=0).get(copy.queue) == key  # given back
    with rabbit_app.connection_for_write() as connection:  # a connection that parked none
        # The entries the last reader gave back are requeued by the broker as its
        # connection closes, not necessarily before this one reads: a poll.
        reader = broker_for(connection)
        wait_until(lambda: reader.registry(max_age=0).get(copy.queue) == key,
                   what="the registry read by a new connection")
        assert recount(broker_for(connection)).get(key) == 2


def receive_after_send(app: Celery, queue: str) -> kombu.Message:
    send(app, "another")
    return receive(app, queue)


def test_rabbitmq_move_to_a_route_no_queue_takes_sets_it_aside(rabbit_app: Celery) -> None:
    """A parked message whose exchange routes nowhere any more (its queue deleted) is
    not dropped: it goes to the unroutable queue, and the move reports nothing moved."""
    from celery_redislock.parking.naming import UNROUTABLE
    from celery_redislock.parking.parked_copy import Route

    queue = rabbit_app.conf.task_default_queue
    with rabbit_app.connection_for_write() as connection:
        rabbit_app.conf.task_queues[0](connection.default_channel).declare()
    send(rabbit_app, "nowhere")
    copy = ParkedCopy.of(receive(rabbit_app, queue), f"redislock:{{t}}:s:{queue}", WAIT)
    copy = ParkedCopy(**{**copy.__dict__, "route": Route(queue, "no.such.key")})
    rabbit_app.parking_queues.append(copy.queue)  # type: ignore[attr-defined]
    with rabbit_app.connection_for_write() as connection:
        broker = broker_for(connection)
        broker.park(copy, "p")
        outcome = broker.move(copy.queue, "m")
        assert (outcome.done, outcome.what) == (False, "unroutable")
        assert broker.lengths([copy.queue]) == {copy.queue: 0}
        channel = connection.channel()
        found = None
        for _ in range(1000):
            message = channel.basic_get(UNROUTABLE, no_ack=False)
            if message is None:
                break
            if message.headers.get("id") == copy.headers["id"]:
                found = message
                channel.basic_ack(message.delivery_tag)
                break
        channel.close()  # gives back any other test's message
        assert found is not None


def test_mover_full_queue_still_takes_the_stop() -> None:
    mover = Mover(FlakyConnection, max_jobs=1)  # not started: nothing is taken out
    assert mover.move(parking_queue("k"), lambda done: None)
    assert not mover.move(parking_queue("k"), lambda done: None)
    assert mover.stop(timeout=0.1)  # does not wait for room
    assert not mover.move(parking_queue("k"), lambda done: None)
