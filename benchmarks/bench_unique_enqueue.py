"""Enqueue latency of a unique send (``lock_unique``) against a plain send, same run.

A private redis-server is both the broker and the lock store. Each round times, in turn,
``N`` plain ``delay()`` calls, ``N`` unique ``delay()`` calls that each take a new key
(the lock is taken, then the message published), and ``N`` unique sends of a key already
taken (deduplicated: one script call, no message). Prints per-send percentiles in µs::

    python -m benchmarks.bench_unique_enqueue [--sends 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

from celery import Celery

from celery_redislock import LimitedTask
from celery_redislock.testing import RedisServer


def make_app(server: RedisServer) -> Celery:
    app = Celery("bench_unique", broker=server.database_url(0), set_as_current=False)
    app.conf.update(redislock_url=server.database_url(1), task_ignore_result=True)

    @app.task(name="bench.plain", shared=False)
    def plain(job: int) -> None: ...

    @app.task(name="bench.unique", base=LimitedTask, shared=False, lock_unique=True,
              lock_key="job:{job}")
    def unique(job: int) -> None: ...

    return app


def time_sends(send: Callable[[int], object], jobs: Sequence[int]) -> List[float]:
    timings = []
    for job in jobs:
        started = time.perf_counter()
        send(job)
        timings.append((time.perf_counter() - started) * 1e6)
    return timings


def percentiles(values: List[float]) -> Dict[str, float]:
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p99": ordered[int(len(ordered) * 0.99) - 1],
            "mean": statistics.fmean(ordered)}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    timings: Dict[str, List[float]] = {"plain": [], "unique, new key": [],
                                       "unique, deduplicated": []}
    with RedisServer() as server:
        app = make_app(server)
        plain, unique = app.tasks["bench.plain"], app.tasks["bench.unique"]
        for job in range(50):  # warm up connections and scripts
            plain.delay(job)
            unique.delay(-1 - job)
        for round_number in range(args.rounds):
            jobs = range(round_number * args.sends, (round_number + 1) * args.sends)
            timings["plain"] += time_sends(plain.delay, jobs)
            timings["unique, new key"] += time_sends(unique.delay, jobs)
            timings["unique, deduplicated"] += time_sends(unique.delay, jobs)
            server.client(db=0).flushdb()  # keep the queue short
        app.close()
    report = {kind: percentiles(values) for kind, values in timings.items()}
    base = report["plain"]["p50"]
    print(f"{'send':<22} {'p50 µs':>8} {'p99 µs':>8} {'mean µs':>8} {'p50 / plain':>12}")
    for kind, figures in report.items():
        print(f"{kind:<22} {figures['p50']:8.0f} {figures['p99']:8.0f} {figures['mean']:8.0f} "
              f"{figures['p50'] / base:12.2f}")
    return report


if __name__ == "__main__":
    main()
