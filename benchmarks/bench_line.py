"""How fast a long waiting line drains, in real workers.

For each N (10, 100, 1,000 by default; ``--sizes 10000`` optional): fresh private
redis-servers (one for the broker and records, one for the lock store alone), 2 prefork
workers x 2 processes on ``benchmarks/line_app.py``. The benchmark takes the only slot
of the key ``line`` by hand, sends N tasks (10 ms bodies) and waits until all N are
parked in the key's waiting line; then it frees the slot and times the drain.

Printed per N: drain rate (tasks/s, from the release to the last body's end), the lock
store's CPU (user+sys seconds per 1,000 hand-offs, from ``INFO cpu``), its commands per
hand-off (``INFO commandstats``), and the broker's publishes per task during the drain
(``LPUSH``: express copies and re-queued waiting copies).

Run from the repository root::

    python -m benchmarks.bench_line
    python -m benchmarks.bench_line --sizes 10 100 1000 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import redis

from celery_redislock import Semaphore
from celery_redislock.engine.keys import DEFAULT_PREFIX, companion_key, semaphore_key
from celery_redislock.testing import RedisServer

from .bench_rate import check_alive, wait_until_ready
from .bench_task_overhead import Worker
from .common import calls_delta, command_calls, markdown_table

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


def run_size(size: int, timeout: float, log_dir: Path) -> Dict[str, Any]:
    """Park ``size`` runs behind one slot, then drain them; the measures."""
    with RedisServer() as broker_server, RedisServer() as lock_server:
        broker, lock = _root(broker_server.url), _root(lock_server.url)
        env = {**os.environ, "REDISLOCK_BENCH_BROKER_URL": f"{broker}/0",
               "REDISLOCK_BENCH_LOCK_URL": f"{lock}/0",
               "REDISLOCK_BENCH_RECORD_URL": f"{broker}/2"}
        os.environ.update(env)
        from . import line_app  # the sender's app, on the same URLs (one size a process)
        workers = [Worker(env, 2, log_dir / f"line-{size}-{i}.log", app=LINE_APP).start()
                   for i in range(2)]
        try:
            wait_until_ready(line_app, workers, 60)
            return _park_and_drain(line_app, workers, size, timeout,
                                   redis.Redis.from_url(f"{lock}/0"),
                                   redis.Redis.from_url(f"{broker}/0"),
                                   redis.Redis.from_url(f"{broker}/2"))
        finally:
            for worker in workers:
                worker.stop()


def _park_and_drain(bench: Any, workers: Sequence[Worker], size: int, timeout: float,
                    lock: redis.Redis, broker: redis.Redis,
                    records: redis.Redis) -> Dict[str, Any]:
    semaphore = Semaphore(lock, bench.KEY, slots=1, lease=3600)
    held = semaphore.acquire(blocking=False)
    assert held is not None
    for seq in range(size):
        bench.drain.delay(seq)
    line = companion_key(semaphore_key(bench.KEY, DEFAULT_PREFIX), "q")
    wait_for(lambda: lock.zcard(line) >= size, timeout, f"{size} runs in line", workers)
    calls, broker_calls, cpu = command_calls(lock), command_calls(broker), cpu_seconds(lock)
    released_us = _server_us(records)
    semaphore.release(held)
    wait_for(lambda: records.llen(bench.ENDS) >= size, timeout, f"{size} runs to drain",
             workers)
    last_end = max(int(value) for value in records.lrange(bench.ENDS, 0, -1))
    seconds = (last_end - released_us) / 1e6
    lock_calls = sum(calls_delta(calls, command_calls(lock)).values())
    publishes = calls_delta(broker_calls, command_calls(broker)).get("lpush", 0)
    return {"size": size, "drain_seconds": seconds, "rate": size / seconds,
            "lock_cpu_per_1000": (cpu_seconds(lock) - cpu) / size * 1000,
            "commands_per_handoff": lock_calls / size, "publishes_per_task": publishes / size}


def _root(url: str) -> str:
    """``redis://host:port`` of a server URL, without a database number."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def report(results: List[Dict[str, Any]]) -> str:
    rows = [(r["size"], f"{r['rate']:.1f}", f"{r['drain_seconds']:.2f}",
             f"{r['lock_cpu_per_1000']:.3f}", f"{r['commands_per_handoff']:.1f}",
             f"{r['publishes_per_task']:.2f}") for r in results]
    return markdown_table(("N", "drain rate /s", "drain s", "lock-store CPU s per 1000",
                           "lock-store commands per hand-off", "publishes per task"), rows)


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one size, as JSON
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-line-"))
    if args.one:
        print(json.dumps(run_size(args.one, args.timeout, log_dir)))
        return []
    results = []
    for size in args.sizes:  # each in a process of its own: a fresh app on fresh servers
        output = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_line", "--one", str(size),
             "--timeout", str(args.timeout)], check=True, capture_output=True, text=True,
        ).stdout
        results.append(json.loads(output.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    print(report(results))
    return results


if __name__ == "__main__":
    main()
