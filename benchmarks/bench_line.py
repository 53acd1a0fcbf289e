"""How a long waiting line holds and drains, in real workers, on the parking line.

For each N (10, 100, 1,000 by default; ``--sizes 10000 100000`` optional), on the
parking line (``--line broker``, its only value: one message in a parking queue of the
broker, the lock store keeping references; the retired ``store`` line, measured beside
it in RESULTS.md, is gone), on fresh private redis-servers (one for the broker and
records, one for the lock store alone), 2 prefork workers x 2 processes on
``benchmarks/line_app.py``: the benchmark takes the only slot of each of ``--keys`` keys
(``line:<k>``) by hand, sends N tasks spread over them (10 ms bodies), waits until all N
wait, measures the line while it is parked, then frees the slots and times the drain.

Printed per line and N:

* while parked (after ``--settle`` s, over ``--window`` s): the workers' RSS beyond idle
  (main processes and pool processes, MB per worker), the broker's and the lock store's
  memory beyond idle (MB) and their commands per second;
* the drain: rate (tasks/s, from the release to the last body's end), hand-off latency
  p50 / p95 (per key, a body's start after the previous body's end, ms), the lock
  store's CPU per 1,000 hand-offs and commands per hand-off, and the broker's publishes
  per task.

Run from the repository root::

    python -m benchmarks.bench_line
    python -m benchmarks.bench_line --sizes 1000 10000
    python -m benchmarks.bench_line --line broker --sizes 100000 --keys 1 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from celery_redislock import Semaphore
from celery_redislock.testing import RedisServer

from .bench_rate import check_alive, wait_until_ready
from .bench_task_overhead import Worker
from .common import calls_delta, command_calls, commands_processed, markdown_table

LINE_APP = "benchmarks.line_app"


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def wait_for(predicate: Any, timeout: float, what: str, workers: Sequence[Worker]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        check_alive(workers)
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Case:
    """One measured line: which line, how many runs, over how many keys."""

    line: str
    size: int
    keys: int = 1
    #: How many runs the drain is timed over (the first ones; 0: all of them).
    drain: int = 0

    @property
    def drained(self) -> int:
        return min(self.drain, self.size) if self.drain else self.size


def run_case(case: Case, timeout: float, settle: float, window: float,
             log_dir: Path) -> Dict[str, Any]:
    """Park ``case.size`` runs behind one held slot per key, measure, then drain them."""
    with RedisServer() as broker_server, RedisServer() as lock_server:
        broker, lock = _root(broker_server.url), _root(lock_server.url)
        env = {**os.environ, "REDISLOCK_BENCH_BROKER_URL": f"{broker}/0",
               "REDISLOCK_BENCH_LOCK_URL": f"{lock}/0",
               "REDISLOCK_BENCH_RECORD_URL": f"{broker}/2",
               "REDISLOCK_BENCH_LINE": case.line}
        os.environ.update(env)
        from . import line_app  # the sender's app, on the same URLs (one case a process)
        workers = [Worker(env, 2, log_dir / f"line-{case.line}-{case.size}-{i}.log",
                          app=LINE_APP).start() for i in range(2)]
        try:
            wait_until_ready(line_app, workers, 60)
            servers = Servers(redis.Redis.from_url(f"{lock}/0"),
                              redis.Redis.from_url(f"{broker}/0"),
                              redis.Redis.from_url(f"{broker}/2"))
            return _park_and_drain(line_app, workers, case, servers,
                                   Timing(timeout, settle, window))
        finally:
            for worker in workers:
                worker.stop()


@dataclass(frozen=True)
class Servers:
    lock: redis.Redis
    broker: redis.Redis
    records: redis.Redis


@dataclass(frozen=True)
class Timing:
    timeout: float
    settle: float
    window: float


def _park_and_drain(bench: Any, workers: Sequence[Worker], case: Case, servers: Servers,
                    timing: Timing) -> Dict[str, Any]:
    idle = _footprint(servers, workers)
    held = [_hold(servers.lock, bench.KEY.format(k=k)) for k in range(case.keys)]
    for seq in range(case.size):
        bench.drain.delay(seq, seq % case.keys)
    wait_for(lambda: _waiting(case, servers) >= case.size, timing.timeout,
             f"{case.size} runs waiting", workers)
    parked = _parked_measures(servers, workers, idle, timing)
    calls, broker_calls = command_calls(servers.lock), command_calls(servers.broker)
    cpu, released_us = cpu_seconds(servers.lock), _server_us(servers.records)
    for semaphore, lease in held:
        semaphore.release(lease)
    wait_for(lambda: servers.records.llen(bench.ENDS) >= case.drained, timing.timeout,
             f"{case.drained} runs to drain", workers)
    runs = [tuple(map(int, value.split()))
            for value in servers.records.lrange(bench.ENDS, 0, case.drained - 1)]
    seconds = (max(end for _, _, end in runs) - released_us) / 1e6
    lock_calls = sum(calls_delta(calls, command_calls(servers.lock)).values())
    publishes = calls_delta(broker_calls, command_calls(servers.broker))
    handoffs = _handoff_ms(runs, released_us)
    return {"line": case.line, "size": case.size, "keys": case.keys, **parked,
            "drained": case.drained, "drain_seconds": seconds, "rate": case.drained / seconds,
            "handoff_p50_ms": percentile(handoffs, 50), "handoff_p95_ms": percentile(handoffs, 95),
            "lock_cpu_per_1000": (cpu_seconds(servers.lock) - cpu) / case.drained * 1000,
            "commands_per_handoff": lock_calls / case.drained,
            "publishes_per_task": (publishes.get("lpush", 0) + publishes.get("rpush", 0))
            / case.drained}


def _hold(lock: redis.Redis, name: str) -> Tuple[Semaphore, Any]:
    semaphore = Semaphore(lock, name, slots=1, lease=3600)
    lease = semaphore.acquire(blocking=False)
    assert lease is not None
    return semaphore, lease


def _waiting(case: Case, servers: Servers) -> int:
    """How many runs wait: the messages in the parking queues."""
    return parked_in_broker(servers.broker)


def parked_in_broker(broker: redis.Redis) -> int:
    """The messages in the broker's parking queues."""
    from celery_redislock.parking import PARKING_PREFIX
    return sum(broker.llen(name) for name in broker.scan_iter(f"{PARKING_PREFIX}*", count=1000)
               if broker.type(name) == b"list")


def _footprint(servers: Servers, workers: Sequence[Worker]) -> Dict[str, float]:
    return {"lock_mb": _used_mb(servers.lock), "broker_mb": _used_mb(servers.broker),
            "worker_mb": sum(_rss_mb(worker) for worker in workers) / len(workers)}


def _parked_measures(servers: Servers, workers: Sequence[Worker], idle: Dict[str, float],
                     timing: Timing) -> Dict[str, float]:
    time.sleep(timing.settle)  # the refusals' last replies and publishes settle
    lock_before = commands_processed(servers.lock)
    broker_before = commands_processed(servers.broker)
    time.sleep(timing.window)
    lock_rate = (commands_processed(servers.lock) - lock_before - 1) / timing.window
    broker_rate = (commands_processed(servers.broker) - broker_before - 1) / timing.window
    now = _footprint(servers, workers)
    return {"parked_worker_mb": now["worker_mb"] - idle["worker_mb"],
            "parked_lock_mb": now["lock_mb"] - idle["lock_mb"],
            "parked_broker_mb": now["broker_mb"] - idle["broker_mb"],
            "parked_lock_cps": lock_rate, "parked_broker_cps": broker_rate}


def _used_mb(client: redis.Redis) -> float:
    return int(client.info("memory")["used_memory"]) / 1e6


def _rss_mb(worker: Worker) -> float:
    """The RSS of a worker's main process and its pool processes (MB)."""
    import psutil
    assert worker.process is not None
    main = psutil.Process(worker.process.pid)
    processes = [main, *main.children(recursive=True)]
    return sum(process.memory_info().rss for process in processes) / 1e6


def _handoff_ms(runs: Sequence[Tuple[int, ...]], released_us: int) -> List[float]:
    """Per key, each body's start after the end of the body before it (the first: after
    the release), ms."""
    by_key: Dict[int, List[Tuple[int, int]]] = {}
    for key, start, end in runs:
        by_key.setdefault(key, []).append((start, end))
    gaps: List[float] = []
    for spans in by_key.values():
        spans.sort()
        previous_end = released_us
        for start, end in spans:
            gaps.append(max(0.0, (start - previous_end) / 1000))
            previous_end = end
    return gaps


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _root(url: str) -> str:
    """``redis://host:port`` of a server URL, without a database number."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def report(results: List[Dict[str, Any]]) -> str:
    rows = [(r["line"], r["size"], r["keys"], r["drained"], f"{r['parked_worker_mb']:.1f}",
             f"{r['parked_broker_mb']:.1f}", f"{r['parked_lock_mb']:.1f}",
             f"{r['parked_broker_cps']:.1f}", f"{r['parked_lock_cps']:.1f}",
             f"{r['rate']:.1f}", f"{r['handoff_p50_ms']:.2f}", f"{r['handoff_p95_ms']:.2f}",
             f"{r['commands_per_handoff']:.1f}", f"{r['publishes_per_task']:.2f}")
            for r in results]
    return markdown_table(
        ("line", "N", "keys", "drain timed over", "worker MB beyond idle", "broker MB",
         "lock store MB",
         "broker cmd/s parked", "lock store cmd/s parked", "drain /s", "hand-off p50 ms",
         "hand-off p95 ms", "lock-store commands per hand-off", "publishes per task"), rows)


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--line", nargs="+", default=["broker"], choices=["broker"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--keys", type=int, nargs="+", default=[1])
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--drain", type=int, default=0,
                        help="time the drain over the first N runs only (0: all)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "line:size:keys:drain", as JSON
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-line-"))
    if args.one:
        line, size, keys, drain = args.one.split(":")
        case = Case(line, int(size), int(keys), int(drain))
        print(json.dumps(run_case(case, args.timeout, args.settle, args.window, log_dir)))
        return []
    results = []
    for size in args.sizes:  # each in a process of its own: a fresh app on fresh servers
        for keys in args.keys:
            for line in args.line:
                output = subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_line", "--one",
                     f"{line}:{size}:{keys}:{args.drain}", "--timeout", str(args.timeout),
                     "--settle", str(args.settle), "--window", str(args.window)],
                    check=True, capture_output=True, text=True).stdout
                results.append(json.loads(output.strip().splitlines()[-1]))
                print(json.dumps(results[-1]), flush=True)
    print(report(results))
    return results


if __name__ == "__main__":
    main()
