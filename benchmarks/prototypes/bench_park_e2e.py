"""Design (c) with a real Celery worker: a freed slot to the oldest parked run's start.

One key of one slot. ``--drain`` runs of ``park.work`` (``park_app.py``) are sent into
the parking queue (a queue no worker consumes), behind them ``--parked - --drain``
copies of one more message (so that the parking list holds ``--parked`` messages), and
the lock store is told ``--drain`` wait. One run is then sent to the work queue: it
takes the slot, and its release moves the oldest parked run to the work queue, whose
release moves the next... Each hand-off's latency is from the release (in the pool
process that held the slot) to the moved run's body start (after the worker received
it from the broker and gave it to a pool process), p50 and p95, with the drain rate.
Each line length in ``--parked`` is run on fresh servers and a fresh worker.

    python -m benchmarks.prototypes.bench_park_e2e --parked 2000 100000 --drain 2000
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from celery_redislock.testing import RedisServer

from ..bench_task_overhead import Worker
from ..common import markdown_table, write_json

APP = "benchmarks.prototypes.park_app"


def load_app(env: Dict[str, str]) -> Any:
    os.environ.update(env)
    if APP in sys.modules:
        return importlib.reload(sys.modules[APP])
    return importlib.import_module(APP)


def fill(app: Any, broker: Any, drain: int, parked: int) -> None:
    """``drain`` real runs in the parking queue, then fillers up to ``parked``."""
    with app.app.producer_or_acquire() as producer:
        for index in range(1, drain + 1):
            app.work.apply_async((index,), queue=app.PARK, producer=producer)
    filler = broker.lindex(app.PARK, 0)
    pipe = broker.pipeline(transaction=False)
    for done in range(parked - drain):
        pipe.lpush(app.PARK, filler)
        if done % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def run_one(parked: int, args: argparse.Namespace) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="redislock-proto-park-") as scratch, \
            RedisServer() as main, RedisServer() as lock:
        env = {**os.environ, "PARK_BROKER_URL": main.database_url(0),
               "PARK_RECORD_URL": main.database_url(3), "PARK_LOCK_URL": lock.url,
               "PARK_HOLD_MS": str(args.hold_ms)}
        app = load_app(env)
        broker, record, lock_client = main.client(db=0), main.client(db=3), lock.client()
        worker = Worker(env, args.concurrency, Path(scratch) / "worker.log", app=APP).start()
        try:
            fill(app, broker, args.drain, parked)
            lock_client.hset(app.STATE, "waiting", args.drain)
            broker_mb = int(broker.info("memory")["used_memory"]) / 1e6
            app.work.apply_async((0, True))
            deadline = time.monotonic() + args.timeout
            while record.llen("starts") < args.drain + 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {record.llen('starts')} started\n"
                                       f"{worker.log_tail()}")
                worker.check_alive()
                time.sleep(0.1)
            starts = dict(line.split() for line in
                          (x.decode() for x in record.lrange("starts", 0, -1)))
            releases = [float(x) for x in record.lrange("releases", 0, -1)]
        finally:
            worker.stop()
            for client in (broker, record, lock_client):
                client.close()
    latencies = sorted(float(starts[str(k + 1)]) - releases[k] for k in range(args.drain))
    span = float(starts[str(args.drain)]) - releases[0]
    return {"parked": parked, "drained": args.drain, "p50_ms": statistics.median(latencies) * 1e3,
            "p95_ms": latencies[int(0.95 * len(latencies))] * 1e3,
            "drain_per_s": args.drain / span, "broker_mb": broker_mb}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parked", type=int, nargs="+", default=[2000, 100000])
    parser.add_argument("--drain", type=int, default=2000)
    parser.add_argument("--hold-ms", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=90.0)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rows: List[Dict[str, Any]] = []
    for parked in args.parked:
        rows.append(run_one(parked, args))
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    table = [(f"{row['parked']:,}", f"{row['drained']:,}",
              f"{row['p50_ms']:.2f} / {row['p95_ms']:.2f}", f"{row['drain_per_s']:.0f}",
              f"{row['drain_per_s'] / rows[0]['drain_per_s']:.2f}",
              f"{row['broker_mb']:.0f}")
             for row in rows]
    markdown = (f"## Prototype (c) end to end: prefork -c {args.concurrency}, tasks of "
                f"{args.hold_ms:g} ms, one slot (load {load:.1f})\n\n" +
                markdown_table(("runs parked", "hand-offs timed",
                                "release → waiter's body start, ms p50 / p95",
                                "drain runs/s", "÷ first line", "broker MB"), table) + "\n")
    data = {"benchmark": "proto_park_e2e", "load": load, "rows": rows, "markdown": markdown}
    write_json("proto_park_e2e.json", data)
    print(markdown)
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
