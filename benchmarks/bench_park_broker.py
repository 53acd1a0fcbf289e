"""The parking line's broker side: µs per park and per move, on a Redis broker and on
RabbitMQ.

For each broker: ``--runs`` Celery messages (real ones, ``--payload`` bytes of argument)
are received once and parked ``--runs`` times, then moved back, first by direct calls of
:class:`~celery_redislock.parking.ParkingBroker` on one connection (each a
blocking round trip: the client's wall time per operation), then through a
:class:`~celery_redislock.parking.Mover` (submitted from this thread, each
job's callback counted: the thread's throughput). On Redis the server's own µs per
script (``INFO commandstats``) is given too, and a move with ``--deep`` messages already
parked, to show the cost does not grow with the line. RabbitMQ is skipped when it does
not answer at ``--amqp``.

    python -m benchmarks.bench_park_broker --runs 2000 --queues 1000

``--queues N`` also measures RabbitMQ's memory per parking queue (``rabbitmqctl
status``; a shared broker's other work adds noise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

import kombu
from celery import Celery

from celery_redislock.parking import Done, Mover, ParkedCopy, broker_for
from celery_redislock.testing import RedisServer

from .common import command_usec, markdown_table, write_json

AMQP_URL = os.environ.get("REDISLOCK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def make_app(broker: str, queue: str) -> Celery:
    app = Celery("bench_park_broker", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, task_ignore_result=True)
    app.task(name="bench.park", bind=True)(_task)
    return app


def _task(self: Any, payload: str) -> None:
    return None


def original(app: Celery, queue: str, payload: int) -> kombu.Message:
    app.tasks["bench.park"].delay("x" * payload)
    got: List[kombu.Message] = []
    with app.connection_for_read() as connection:
        with kombu.Consumer(connection, [kombu.Queue(queue, routing_key=queue)],
                            accept=["json"], on_message=got.append):
            while not got:
                connection.drain_events(timeout=5)
        got[0].ack()
    return got[0]


def drain(app: Celery, queue: str) -> None:
    with app.connection_for_write() as connection:
        kombu.Queue(queue, routing_key=queue)(connection.default_channel).purge()


def direct(app: Celery, copy: ParkedCopy, runs: int) -> Dict[str, float]:
    with app.connection_for_write() as connection:
        broker = broker_for(connection)
        started = time.perf_counter()
        for index in range(runs):
            broker.park(copy, f"p{index}-{uuid.uuid4().hex}")
        park = (time.perf_counter() - started) / runs * 1e6
        started = time.perf_counter()
        for index in range(runs):
            if not broker.move(copy.queue, f"m{index}-{uuid.uuid4().hex}").done:
                raise RuntimeError("a move found nothing")
        move = (time.perf_counter() - started) / runs * 1e6
    return {"park_us": park, "move_us": move}


def through_mover(app: Celery, copy: ParkedCopy, runs: int) -> Dict[str, float]:
    done = threading.Semaphore(0)
    failures: List[Done] = []

    def on_done(result: Done) -> None:
        if not result.ok:
            failures.append(result)
        done.release()

    mover = Mover.for_app(app, max_jobs=runs + 1).start()
    try:
        rates = {}
        for kind in ("park", "move"):
            started = time.perf_counter()
            for _ in range(runs):
                taken = (mover.park(copy, on_done) if kind == "park"
                         else mover.move(copy.queue, on_done))
                assert taken
            for _ in range(runs):
                done.acquire()
            rates[f"mover_{kind}_us"] = (time.perf_counter() - started) / runs * 1e6
    finally:
        mover.stop()
    if failures:
        raise RuntimeError(f"{len(failures)} jobs failed: {failures[0]}")
    return rates


def server_us(client: Any, runs: int, action: Any) -> float:
    client.config_resetstat()
    action()
    usec = command_usec(client)
    return (usec.get("evalsha", 0) + usec.get("eval", 0)) / runs


def bench_redis(args: argparse.Namespace) -> Dict[str, Any]:
    with RedisServer() as server:
        queue = "bench-park"
        app = make_app(server.database_url(0), queue)
        copy = ParkedCopy.of(original(app, queue, args.payload), "redislock:{b}:s:bench", {
            "v": 2, "park_id": "1:1", "line": "redislock:{b}:s:bench"})
        row: Dict[str, Any] = {"broker": "Redis", **direct(app, copy, args.runs)}
        drain(app, queue)
        row.update(through_mover(app, copy, args.runs))
        drain(app, queue)
        client = server.client()
        with app.connection_for_write() as connection:
            broker = broker_for(connection)
            row["server_park_us"] = server_us(client, args.runs, lambda: [
                broker.park(copy, uuid.uuid4().hex) for _ in range(args.runs)])
            row["server_move_us"] = server_us(client, args.runs, lambda: [
                broker.move(copy.queue, uuid.uuid4().hex) for _ in range(args.runs)])
            drain(app, queue)
            filler = client.lindex(copy.queue, 0) or _one(broker, copy, client)
            pipe = client.pipeline(transaction=False)
            for index in range(args.deep):
                pipe.lpush(copy.queue, filler)
                if index % 5000 == 4999:
                    pipe.execute()
            pipe.execute()
            row["server_move_deep_us"] = server_us(client, args.runs, lambda: [
                broker.move(copy.queue, uuid.uuid4().hex) for _ in range(args.runs)])
        row["message_bytes"] = len(filler)
        client.close()
    return row


def _one(broker: Any, copy: ParkedCopy, client: Any) -> bytes:
    broker.park(copy, uuid.uuid4().hex)
    return bytes(client.lindex(copy.queue, 0))


def bench_amqp(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    try:
        with kombu.Connection(args.amqp, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        print(f"RabbitMQ skipped: {exc!r}", file=sys.stderr)
        return None
    queue = f"bench-park-{uuid.uuid4().hex[:8]}"
    app = make_app(args.amqp, queue)
    copy = ParkedCopy.of(original(app, queue, args.payload), f"redislock:{{b}}:s:{queue}",
                         {"v": 2, "park_id": "1:1"})
    try:
        row: Dict[str, Any] = {"broker": "RabbitMQ", **direct(app, copy, args.runs)}
        drain(app, queue)
        row.update(through_mover(app, copy, args.runs))
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
            connection.default_channel.queue_delete(copy.queue)
    return row


def rabbit_memory() -> Optional[Dict[str, float]]:
    """RabbitMQ's memory by category (bytes), from ``rabbitmqctl status``; None without it."""
    try:
        out = subprocess.run(["rabbitmqctl", "status", "--formatter", "json"],
                             capture_output=True, timeout=60, check=True).stdout
        memory = json.loads(out)["memory"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None
    found = {name: float(value) for name, value in memory.items()
             if isinstance(value, (int, float))}
    total = memory.get("total")
    if isinstance(total, dict):
        found["total"] = float(total.get("erlang") or total.get("allocated") or 0)
    return found


def bench_amqp_queues(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """RabbitMQ's cost per parking queue: ``--queues`` lines of one parked run each
    (the first park into a queue declares it and registers it), then deleted."""
    before = rabbit_memory()
    if before is None:
        print("RabbitMQ's memory not measured: no rabbitmqctl", file=sys.stderr)
        return None
    queue = f"bench-park-{uuid.uuid4().hex[:8]}"
    app = make_app(args.amqp, queue)
    message = original(app, queue, args.payload)
    copies = [ParkedCopy.of(message, f"redislock:{{b}}:s:{queue}:{index}", {"v": 2})
              for index in range(args.queues)]
    try:
        with app.connection_for_write() as connection:
            broker = broker_for(connection)
            started = time.perf_counter()
            for copy in copies:
                broker.park(copy, uuid.uuid4().hex)
            first_park = (time.perf_counter() - started) / args.queues * 1e6
            time.sleep(2)  # let the queue processes settle
            after = rabbit_memory() or {}
    finally:
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            for name in [queue, *(copy.queue for copy in copies)]:
                channel.queue_delete(name)
            broker_for(connection).registry(max_age=0)  # drops the deleted queues' entries
    per_queue = {name: (after.get(name, 0) - before.get(name, 0)) / args.queues
                 for name in ("total", "queue_procs", "mnesia", "other_ets", "msg_index",
                              "binary")}
    return {"queues": args.queues, "first_park_us": first_park, "bytes_per_queue": per_queue}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--payload", type=int, default=500, help="bytes of argument")
    parser.add_argument("--deep", type=int, default=100_000,
                        help="messages parked before the Redis server's deep moves")
    parser.add_argument("--amqp", default=AMQP_URL)
    parser.add_argument("--queues", type=int, default=0,
                        help="RabbitMQ: also measure the memory of this many parking queues")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rows = [row for row in (bench_redis(args), bench_amqp(args)) if row]

    def cell(row: Dict[str, Any], name: str) -> str:
        return f"{row[name]:.0f}" if name in row else "—"

    table = [(row["broker"], cell(row, "park_us"), cell(row, "move_us"),
              cell(row, "mover_park_us"), cell(row, "mover_move_us"),
              f"{cell(row, 'server_park_us')} / {cell(row, 'server_move_us')} / "
              f"{cell(row, 'server_move_deep_us')}") for row in rows]
    markdown = (f"## Parking line, broker side: {args.runs} parks and moves, "
                f"{args.payload}-byte argument (load {load:.1f})\n\n" +
                markdown_table(("broker", "park µs (call)", "move µs (call)",
                                "park µs (mover)", "move µs (mover)",
                                f"server µs park / move / move with {args.deep:,} parked"),
                               table) + "\n")
    queues = bench_amqp_queues(args) if args.queues else None
    if queues:
        cost = queues["bytes_per_queue"]
        markdown += (f"\nRabbitMQ, {queues['queues']:,} parking queues of one run each: "
                     f"the first park into a queue {queues['first_park_us']:.0f} µs; "
                     f"{cost['total'] / 1e3:.1f} KB of memory per queue (queue processes "
                     f"{cost['queue_procs'] / 1e3:.1f} KB, tables "
                     f"{(cost['mnesia'] + cost['other_ets']) / 1e3:.1f} KB).\n")
    data = {"benchmark": "park_broker", "load": load, "rows": rows, "queues": queues,
            "markdown": markdown}
    write_json("park_broker.json", data)
    print(markdown)
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
