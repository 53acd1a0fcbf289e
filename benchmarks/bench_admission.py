"""Admission of limited runs against plain tasks and the peers, every kind in one run.

The peer benchmark's rounds (``benchmarks/bench_peers.py``: each batch divided by the
plain batches just before and after it, kinds rotated from round to round, medians over
the rounds) on ``benchmarks/admission_app.py``: ``LimitedTask`` never contended, asked
with the blocking gate (``blocking``), without blocking from the worker's event loop
(``async``) and on the parking line (``parked``), beside celery-once and
celery-singleton, results ignored and stored.

``--delay-ms D`` puts the lock store behind ``prototypes/delay_proxy.py`` (D ms each
way, loopback), for the worker and the sender alike (the peers lock in the sender).
``--tasks-ms`` makes every task sleep that long (0: no-op tasks).

    python -m benchmarks.bench_admission --delay-ms 1 --tasks-ms 20 --concurrency 8
    python -m benchmarks.bench_admission --concurrency 2 --tasks 400   # no-op tasks

The machine is shared: report the load (``uptime``) with the table, and the medians of
the interleaved rounds and their ratios, never one batch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence

from celery_redislock.testing import RedisServer

from . import bench_peers
from .bench_task_overhead import CpuMeter, Worker
from .common import environment, write_json
from .prototypes.delay_proxy import running as delay_proxy

APP = "benchmarks.admission_app"
bench_peers.LABELS.update({
    "blocking": "LimitedTask, redislock_gate = blocking",
    "async": "LimitedTask, redislock_gate = async (look-ahead)",
    "parked": "LimitedTask, async, redislock_line = broker",
    "parked_no_hand_on": "LimitedTask, async, broker line, redislock_hand_on = False",
})


def load_app(env: Dict[str, str]) -> Any:
    os.environ.update(env)
    if APP in sys.modules:
        return importlib.reload(sys.modules[APP])
    return importlib.import_module(APP)


@contextlib.contextmanager
def started(args: argparse.Namespace) -> Iterator[bench_peers.Bench]:
    with tempfile.TemporaryDirectory(prefix="redislock-admission-") as scratch, \
            RedisServer() as main, RedisServer() as lock, contextlib.ExitStack() as stack:
        lock_url = lock.database_url(0)
        if args.delay_ms:
            port = stack.enter_context(delay_proxy(lock.port, args.delay_ms, 3600))
            lock_url = f"redis://127.0.0.1:{port}/0"
        envs = [bench_peers.peers_env(main, lock, sender=sender) for sender in (True, False)]
        for env in envs:
            env["REDISLOCK_BENCH_LOCK_URL"] = lock_url
            env["ADMISSION_TASK_SECONDS"] = str(args.tasks_ms / 1000.0)
        app = load_app(envs[0])
        worker = Worker(envs[1], args.concurrency, Path(scratch) / "worker.log",
                        app=APP, pool=args.pool).start()
        counters, results, lock_client = (main.client(db=bench_peers.COUNTER_DB),
                                          main.client(db=bench_peers.BACKEND_DB),
                                          lock.client())
        try:
            assert worker.process and main.process and lock.process
            cpu = CpuMeter(worker.process.pid, main.process.pid,
                           more={"lock_store": lock.process.pid})
            yield bench_peers.Bench(app, counters, results, lock_client, worker, cpu,
                                    args.timeout)
        finally:
            worker.stop()
            for client in (counters, results, lock_client):
                client.close()


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--pool", choices=("prefork", "solo"), default="prefork")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--kinds", default="", help="comma-separated (default: all)")
    parser.add_argument("--modes", default="", help="ignored, stored or both (default)")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--tasks-ms", "--task-ms", dest="tasks_ms", type=float, default=0.0)
    parser.add_argument("--out", default="admission.json")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.pool == "solo":
        args.concurrency = 1
    args.fake_store = ""
    load_before = os.getloadavg()
    with started(args) as bench:
        batches = bench_peers.run_rounds(bench, args)
        machine = environment(bench.lock)
    data = bench_peers.build_report(bench.app, batches, args, machine)
    load_after = os.getloadavg()
    data.update(delay_ms=args.delay_ms, tasks_ms=args.tasks_ms, load_before=load_before,
                load_after=load_after)
    work = f"tasks of {args.tasks_ms:g} ms" if args.tasks_ms else "no-op tasks"
    title = (f"## Admission: {args.pool} -c {args.concurrency}, {work}, "
             f"lock store {args.delay_ms:g} ms away each way, {args.rounds} rounds of "
             f"{args.tasks}, load {load_before[0]:.1f} before, {load_after[0]:.1f} after\n")
    data["markdown"] = title + bench_peers.markdown_report(data).split("\n", 1)[1]
    path = write_json(args.out, data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
