"""How a long waiting line holds and drains, in real workers, on the parking line.

For each N (10, 100, 1,000 by default; ``--sizes 10000 100000`` optional), on the
parking line (``--line broker``, its only value: one message in a parking queue of the
broker, the lock store keeping references; the retired ``store`` line, measured beside
it in RESULTS.md, is gone), on fresh private redis-servers (one for the broker and
records, one for the lock store alone), 2 prefork workers x 2 processes on
``benchmarks/line_app.py``: the benchmark takes the only slot of each of ``--keys`` keys
(``line:<k>``) by hand, sends N tasks spread over them (10 ms bodies), waits until all N
wait, measures the line while it is parked, then frees the slots as a worker does (each
release moves the next parked run at once) and times the drain.

Printed per line and N:

* while parked (after ``--settle`` s, over ``--window`` s): the workers' RSS beyond idle
  (main processes and pool processes, MB per worker), the broker's and the lock store's
  memory beyond idle (MB) and their commands per second;
* the drain: rate (tasks/s, from the release to the last body's end), hand-off latency
  p50 / p95 (per key, a body's start after the previous body's end on that key, ms; a
  key's first run after the release is not counted), how many hand-offs that is, the lock
  store's CPU per 1,000 hand-offs and commands per hand-off, and the broker's pushes per
  run drained (``LPUSH`` + ``RPUSH``: the moves, the parks, and this benchmark's record
  of each body's end, on the same server; without a run parked twice: 2.00 on one key,
  about (keys + hand-offs) / drained + 1 over many keys, each released slot moving one),
  and, from the lock store's counts over every key, the parks per run drained beyond
  the first (a run parked again) and the slots handed to the line per run drained (1.00
  without churn: each run moved once);
* another tenant (``--tenant`` runs of a task on its own key, which has no line, sent one
  at a time): each run's start after its send, p50 / p95 (ms), before the line is parked
  and while it is;
* after the table, the commands per second while parked by command, the busiest first
  (``INFO commandstats``, scripts' inner commands included), and the servers' time per
  run drained by command (a script's own entry covers its inner commands).

Run from the repository root::

    python -m benchmarks.bench_line
    python -m benchmarks.bench_line --sizes 1000 10000
    python -m benchmarks.bench_line --line broker --sizes 100000 --keys 1 10000
"""

from __future__ import annotations

import argparse
import functools
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

from celery_redislock.engine.admission import Lease, SlotLimit
from celery_redislock.engine.parking import park_admit, run_id
from celery_redislock.line import moves
from celery_redislock.testing import RedisServer

from .bench_rate import check_alive, wait_until_ready
from .bench_task_overhead import Worker
from .common import (
    calls_delta,
    command_calls,
    command_usec,
    commands_processed,
    markdown_table,
)

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
    #: How many runs another tenant sends, before the line parks and while it is parked.
    tenant: int = 0

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
    tenant_idle = _tenant_ms(bench, servers, workers, case.tenant, timing.timeout)
    idle = _footprint(servers, workers)
    held = [_hold(servers.lock, bench.KEY.format(k=k)) for k in range(case.keys)]
    for seq in range(case.size):
        bench.drain.delay(seq, seq % case.keys)
    wait_for(lambda: _waiting(case, servers) >= case.size, timing.timeout,
             f"{case.size} runs waiting", workers)
    parked = _parked_measures(servers, workers, idle, timing)
    tenant_parked = _tenant_ms(bench, servers, workers, case.tenant, timing.timeout)
    calls, broker_calls = command_calls(servers.lock), command_calls(servers.broker)
    usec = {"lock": command_usec(servers.lock), "broker": command_usec(servers.broker)}
    cpu, released_us = cpu_seconds(servers.lock), _server_us(servers.records)
    counted = line_counts(servers.lock)
    for lease in held:  # as a worker's release: the next run moved at once
        lease.release()
        moves.owe(bench.app, lease.handoffs)
    wait_for(lambda: servers.records.llen(bench.ENDS) >= case.drained, timing.timeout,
             f"{case.drained} runs to drain", workers)
    runs = [tuple(map(int, value.split()))
            for value in servers.records.lrange(bench.ENDS, 0, case.drained - 1)]
    parks, handed = (now - before for now, before in zip(line_counts(servers.lock), counted))
    seconds = (max(end for _, _, end in runs) - released_us) / 1e6
    lock_calls = sum(calls_delta(calls, command_calls(servers.lock)).values())
    publishes = calls_delta(broker_calls, command_calls(servers.broker))
    handoffs = _handoff_ms(runs)
    spent = {"lock": calls_delta(usec["lock"], command_usec(servers.lock)),
             "broker": calls_delta(usec["broker"], command_usec(servers.broker))}
    return {"line": case.line, "size": case.size, "keys": case.keys, **parked,
            "drained": case.drained, "drain_seconds": seconds, "rate": case.drained / seconds,
            "handoff_p50_ms": percentile(handoffs, 50), "handoff_p95_ms": percentile(handoffs, 95),
            "handoffs": len(handoffs), "parks_per_run": parks / case.drained,
            "handed_per_run": handed / case.drained,
            "drain_us_per_run": {server: {name: us / case.drained for name, us in
                                          sorted(by.items(), key=lambda kv: -kv[1])[:6]}
                                 for server, by in spent.items()},
            "lock_cpu_per_1000": (cpu_seconds(servers.lock) - cpu) / case.drained * 1000,
            "commands_per_handoff": lock_calls / case.drained,
            "publishes_per_task": (publishes.get("lpush", 0) + publishes.get("rpush", 0))
            / case.drained,
            "tenant_idle_p50_ms": percentile(tenant_idle, 50),
            "tenant_idle_p95_ms": percentile(tenant_idle, 95),
            "tenant_parked_p50_ms": percentile(tenant_parked, 50),
            "tenant_parked_p95_ms": percentile(tenant_parked, 95)}


def line_counts(lock: redis.Redis) -> Tuple[int, int]:
    """Over every key's parked line: how many parks (a run parked again counts again)
    and how many slots were handed to the line (reservations), so far."""
    parks = handed = 0
    for name in lock.scan_iter("*}:pn:*", count=1000):
        n, v = lock.hmget(name, "n", "v")
        parks, handed = parks + int(n or 0), handed + int(v or 0)
    return parks, handed


def _tenant_ms(bench: Any, servers: Servers, workers: Sequence[Worker], runs: int,
               timeout: float) -> List[float]:
    """Another tenant's ``runs`` runs on a key with no line, sent one at a time: each
    one's body start after its send (server clock), ms."""
    starts = bench.OTHER_STARTS
    first = servers.records.llen(starts)
    latencies: List[float] = []
    for seen in range(first, first + runs):
        sent = _server_us(servers.records)
        bench.other.delay()
        wait_for(functools.partial(_longer, servers.records, starts, seen), timeout,
                 "another tenant's run", workers)
        started = servers.records.lindex(starts, seen)
        assert started is not None
        latencies.append((int(started) - sent) / 1000)
    return latencies


def _longer(client: redis.Redis, name: str, than: int) -> bool:
    return int(client.llen(name)) > than


def _hold(lock: redis.Redis, name: str) -> Lease:
    """The one slot of ``name``, taken as a worker takes it: its release reserves the
    freed slot for the line and says which run to move (``handoffs``)."""
    lease = park_admit(lock, [SlotLimit(name, 1, "redislock:")], lease=3600,
                       run=run_id(f"bench-hold-{name}", 0))
    assert isinstance(lease, Lease)
    return lease


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
                     timing: Timing) -> Dict[str, Any]:
    time.sleep(timing.settle)  # the refusals' last replies and publishes settle
    lock_calls, broker_calls = command_calls(servers.lock), command_calls(servers.broker)
    lock_before = commands_processed(servers.lock)
    broker_before = commands_processed(servers.broker)
    time.sleep(timing.window)
    lock_rate = (commands_processed(servers.lock) - lock_before - 1) / timing.window
    broker_rate = (commands_processed(servers.broker) - broker_before - 1) / timing.window
    by_command = {"lock": calls_delta(lock_calls, command_calls(servers.lock)),
                  "broker": calls_delta(broker_calls, command_calls(servers.broker))}
    now = _footprint(servers, workers)
    return {"parked_worker_mb": now["worker_mb"] - idle["worker_mb"],
            "parked_lock_mb": now["lock_mb"] - idle["lock_mb"],
            "parked_broker_mb": now["broker_mb"] - idle["broker_mb"],
            "parked_lock_cps": lock_rate, "parked_broker_cps": broker_rate,
            "parked_by_command": {server: {name: calls / timing.window for name, calls in
                                           sorted(calls.items(), key=lambda kv: -kv[1])[:8]}
                                  for server, calls in by_command.items()}}


def _used_mb(client: redis.Redis) -> float:
    return int(client.info("memory")["used_memory"]) / 1e6


def _rss_mb(worker: Worker) -> float:
    """The RSS of a worker's main process and its pool processes (MB)."""
    import psutil
    assert worker.process is not None
    main = psutil.Process(worker.process.pid)
    processes = [main, *main.children(recursive=True)]
    return sum(process.memory_info().rss for process in processes) / 1e6


def _handoff_ms(runs: Sequence[Tuple[int, ...]]) -> List[float]:
    """Per key, each body's start after the end of the body before it on that key (a
    slot handed from one run to the next), ms. A key's first run after the release is
    not a hand-off: over many keys, thousands are released at once and queue for the
    workers' processes.

        >>> _handoff_ms([(0, 100, 200), (1, 150, 250), (0, 1200, 1300)])
        [1.0]
    """
    by_key: Dict[int, List[Tuple[int, int]]] = {}
    for key, start, end in runs:
        by_key.setdefault(key, []).append((start, end))
    gaps: List[float] = []
    for spans in by_key.values():
        spans.sort()
        gaps.extend(max(0.0, (start - previous[1]) / 1000)
                    for previous, (start, _) in zip(spans, spans[1:]))
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
             f"{r['rate']:.1f}", r["handoffs"], f"{r['handoff_p50_ms']:.2f}",
             f"{r['handoff_p95_ms']:.2f}",
             f"{r['commands_per_handoff']:.1f}", f"{r['publishes_per_task']:.2f}",
             f"{r['parks_per_run']:.2f}", f"{r['handed_per_run']:.2f}",
             f"{r['tenant_idle_p50_ms']:.1f} / {r['tenant_idle_p95_ms']:.1f}",
             f"{r['tenant_parked_p50_ms']:.1f} / {r['tenant_parked_p95_ms']:.1f}")
            for r in results]
    return markdown_table(
        ("line", "N", "keys", "drain timed over", "worker MB beyond idle", "broker MB",
         "lock store MB", "broker cmd/s parked", "lock store cmd/s parked", "drain /s",
         "hand-offs", "hand-off p50 ms", "hand-off p95 ms", "lock-store commands per hand-off",
         "publishes per task", "parks again per run", "slots handed per run",
         "other tenant ms p50 / p95, no line", "other tenant ms p50 / p95, line parked"),
        rows) + "".join(_by_command(r) for r in results)


def _by_command(result: Dict[str, Any]) -> str:
    """One line per server: its commands per second while parked, busiest first."""
    return "".join(
        f"\n- {result['size']} over {result['keys']} keys, {server} cmd/s parked: "
        + ", ".join(f"{name} {rate:.1f}" for name, rate in calls.items())
        for server, calls in result["parked_by_command"].items()) + "".join(
        f"\n- {result['size']} over {result['keys']} keys, {server} µs per run drained: "
        + ", ".join(f"{name} {us:.1f}" for name, us in spent.items())
        for server, spent in result["drain_us_per_run"].items())


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
    parser.add_argument("--tenant", type=int, default=50,
                        help="another tenant's runs, sent one at a time (0: none)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "line:size:keys:drain:tenant"
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-line-"))
    if args.one:
        line, size, keys, drain, tenant = args.one.split(":")
        case = Case(line, int(size), int(keys), int(drain), int(tenant))
        print(json.dumps(run_case(case, args.timeout, args.settle, args.window, log_dir)))
        return []
    results = []
    for size in args.sizes:  # each in a process of its own: a fresh app on fresh servers
        for keys in args.keys:
            for line in args.line:
                output = subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_line", "--one",
                     f"{line}:{size}:{keys}:{args.drain}:{args.tenant}",
                     "--timeout", str(args.timeout),
                     "--settle", str(args.settle), "--window", str(args.window)],
                    check=True, capture_output=True, text=True).stdout
                results.append(json.loads(output.strip().splitlines()[-1]))
                print(json.dumps(results[-1]), flush=True)
    print(report(results))
    return results


if __name__ == "__main__":
    main()
