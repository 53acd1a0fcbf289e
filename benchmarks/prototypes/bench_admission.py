"""Admission that never blocks the worker's event loop, against today's blocking call.

The peer benchmark (``benchmarks/bench_peers.py``: its rounds, batches, ratios and CPU
accounting, reused as they are) on ``benchmarks/prototypes/nb_app.py``, which adds the
kind ``hub``: ``admit.lua`` asked from the main process on a socket driven by the
worker's event loop (``hub_gate.py``), beside today's ``LimitedTask`` (``slots``),
celery-once and celery-singleton, every kind in the same run, each batch divided by the
plain batches on either side of it.

``--delay-ms D`` puts the lock store behind ``delay_proxy.py`` (D ms each way, loopback),
for the worker and the sender alike (the peers take their locks in the sender).
``--task-ms`` makes every task sleep that long.

    python -m benchmarks.prototypes.bench_admission --pool solo --tasks 400 --rounds 4
    python -m benchmarks.prototypes.bench_admission --delay-ms 1 --task-ms 20 \
        --concurrency 8 --tasks 300 --rounds 3 --modes ignored
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence

from celery_redislock.testing import RedisServer

from .. import bench_peers
from ..bench_task_overhead import CpuMeter, Worker
from ..common import environment, write_json

APP = "benchmarks.prototypes.nb_app"
bench_peers.LABELS["hub"] = "prototype: admit.lua from the event loop, non-blocking"
bench_peers.LABELS["slots"] = "LimitedTask, lock_slots (today: blocking call)"


@contextlib.contextmanager
def delay_proxy(port: int, delay_ms: float, seconds: float) -> Iterator[int]:
    """A delay proxy in front of 127.0.0.1:``port``; yields its port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.prototypes.delay_proxy", "--target",
         f"127.0.0.1:{port}", "--delay-ms", str(delay_ms), "--seconds", str(seconds)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError("the delay proxy did not start")
        yield int(line[1])
    finally:
        process.terminate()
        process.wait(timeout=10)


def load_app(env: Dict[str, str]) -> Any:
    os.environ.update(env)
    if APP in sys.modules:
        return importlib.reload(sys.modules[APP])
    return importlib.import_module(APP)


@contextlib.contextmanager
def started(args: argparse.Namespace) -> Iterator[bench_peers.Bench]:
    with tempfile.TemporaryDirectory(prefix="redislock-proto-adm-") as scratch, \
            RedisServer() as main, RedisServer() as lock, contextlib.ExitStack() as stack:
        lock_url = lock.database_url(0)
        if args.delay_ms:
            port = stack.enter_context(delay_proxy(lock.port, args.delay_ms, 900))
            lock_url = f"redis://127.0.0.1:{port}/0"
        sender_env = bench_peers.peers_env(main, lock, sender=True)
        worker_env = bench_peers.peers_env(main, lock, sender=False)
        for env in (sender_env, worker_env):
            env["REDISLOCK_BENCH_LOCK_URL"] = lock_url
            env["NB_TASK_SECONDS"] = str(args.task_ms / 1000.0)
        app = load_app(sender_env)
        worker = Worker(worker_env, args.concurrency, Path(scratch) / "worker.log",
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
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--pool", choices=("prefork", "solo"), default="solo")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--kinds", default="")
    parser.add_argument("--modes", default="")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--task-ms", type=float, default=0.0)
    parser.add_argument("--out", default="proto_admission.json")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.pool == "solo":
        args.concurrency = 1
    args.fake_store = ""
    with started(args) as bench:
        batches = bench_peers.run_rounds(bench, args)
        machine = environment(bench.lock)
    data = bench_peers.build_report(bench.app, batches, args, machine)
    data.update(delay_ms=args.delay_ms, task_ms=args.task_ms, load_before=os.getloadavg())
    title = (f"## Prototype admission: {args.pool} -c {args.concurrency}, tasks of "
             f"{args.task_ms:g} ms, lock store {args.delay_ms:g} ms away each way, "
             f"load {os.getloadavg()[0]:.1f}\n")
    data["markdown"] = title + bench_peers.markdown_report(data).split("\n", 1)[1]
    path = write_json(args.out, data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
