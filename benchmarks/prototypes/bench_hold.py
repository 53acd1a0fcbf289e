"""(a) A waiting run held by one worker: what holding costs the worker and the broker.

Design (a) keeps every waiting run in the memory of the worker that received it, its
message unacknowledged, as Celery holds a task with an ETA. This measures that holding at
``--counts`` runs (default 20,000 and 100,000), each in a fresh pair of processes:

* ``celery``: a real ``celery worker`` (solo pool: only the main process holds) receives
  N tasks sent with a countdown of ``--countdown`` s (below the broker's visibility
  timeout): Celery's own ETA holding, a ``Request`` and a timer entry per run -- what
  today's waiting copies cost, and what (a) would cost if it held runs as Celery does;
* ``lean``: a kombu consumer that keeps only each unacknowledged message object (what a
  lean (a) would keep: enough to acknowledge or re-publish it), no Request, no timer.

Reported: the holder's RSS over its RSS before the runs came (MB, and KB per run), the
broker's memory per held run (kombu's Redis transport copies every unacknowledged
message into its ``unacked`` hash), how long taking them in took, and the re-publish
traffic a holder owes the broker to stay under its visibility timeout (every held run
moved once per half timeout: N / (timeout / 2) per second, 1 h by default).

    python -m benchmarks.prototypes.bench_hold --counts 20000 100000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import psutil

from celery_redislock.testing import RedisServer

from ..common import markdown_table, write_json

APP_SOURCE = '''
import os
from celery import Celery
app = Celery("hold", broker=os.environ["HOLD_BROKER"])
app.conf.update(worker_hijack_root_logger=False, task_default_queue="hold",
                broker_connection_retry_on_startup=True)

@app.task(name="hold.work", ignore_result=True)
def work(customer):
    return customer
'''

LEAN_SOURCE = '''
import os, sys, time
from kombu import Connection, Queue
held = []
with Connection(os.environ["HOLD_BROKER"]) as conn:
    queue = Queue("hold", routing_key="hold")
    with conn.Consumer(queue, callbacks=[lambda body, message: held.append(message)],
                       accept=["json"], prefetch_count=0):
        print("ready", flush=True)
        deadline = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
'''

VISIBILITY = 3600.0


def send(broker_url: str, count: int, countdown: float, app_dir: str) -> float:
    """Send ``count`` runs with a countdown, from a child process; seconds taken."""
    code = (f"import sys; sys.path.insert(0, {app_dir!r}); import hold_app\n"
            f"t = hold_app.work\n"
            f"with hold_app.app.producer_or_acquire() as p:\n"
            f"    for i in range({count}):\n"
            f"        t.apply_async((i,), countdown={countdown}, producer=p)\n")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "HOLD_BROKER": broker_url}, timeout=170)
    return time.perf_counter() - started


def held_in_broker(client: Any) -> int:
    return int(client.hlen("unacked"))


def measure(kind: str, count: int, args: argparse.Namespace, app_dir: str) -> Dict[str, Any]:
    with RedisServer() as broker:
        client = broker.client()
        env = {**os.environ, "HOLD_BROKER": broker.url}
        if kind == "celery":
            command = [sys.executable, "-m", "celery", "-A", "hold_app", "worker", "--pool",
                       "solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
                       "--loglevel", "WARNING", "--prefetch-multiplier", "1"]
            env["PYTHONPATH"] = app_dir + os.pathsep + env.get("PYTHONPATH", "")
        else:
            command = [sys.executable, "-c", LEAN_SOURCE, str(args.timeout)]
        holder = subprocess.Popen(command, env=env, cwd=app_dir, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process = psutil.Process(holder.pid)
            time.sleep(args.settle)
            idle_rss = process.memory_info().rss
            broker_before = int(client.info("memory")["used_memory"])
            started = time.perf_counter()
            sent_seconds = send(broker.url, count, args.countdown, app_dir)
            deadline = time.monotonic() + args.timeout
            while held_in_broker(client) < count or client.llen("hold") > 0:
                if time.monotonic() > deadline or holder.poll() is not None:
                    raise RuntimeError(f"{kind}: only {held_in_broker(client)} of {count} held")
                time.sleep(0.2)
            taken = time.perf_counter() - started
            time.sleep(1.0)
            rss = process.memory_info().rss
            broker_bytes = int(client.info("memory")["used_memory"]) - broker_before
        finally:
            holder.terminate()
            try:
                holder.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(holder.pid, 9)
                holder.wait(timeout=10)
            client.close()
    return {"kind": kind, "held": count, "idle_rss_mb": idle_rss / 1e6,
            "rss_mb": rss / 1e6, "rss_over_idle_mb": (rss - idle_rss) / 1e6,
            "kb_per_run": (rss - idle_rss) / count / 1e3,
            "broker_mb": broker_bytes / 1e6, "broker_bytes_per_run": broker_bytes / count,
            "send_seconds": sent_seconds, "take_in_seconds": taken,
            "republish_per_s": count / (VISIBILITY / 2)}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--kinds", nargs="+", default=["lean", "celery"])
    parser.add_argument("--countdown", type=float, default=1500.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--timeout", type=float, default=150.0)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="redislock-proto-hold-") as app_dir:
        Path(app_dir, "hold_app.py").write_text(APP_SOURCE)
        for count in args.counts:
            for kind in args.kinds:
                row = measure(kind, count, args, app_dir)
                print(f"  {row}", file=sys.stderr, flush=True)
                rows.append(row)
    table = [(row["kind"], f"{row['held']:,}", f"{row['idle_rss_mb']:.0f}",
              f"{row['rss_mb']:.0f}", f"{row['rss_over_idle_mb']:.0f}",
              f"{row['kb_per_run']:.2f}", f"{row['broker_mb']:.0f}",
              f"{row['broker_bytes_per_run']:.0f}", f"{row['take_in_seconds']:.0f}",
              f"{row['republish_per_s']:.0f}") for row in rows]
    markdown = (f"## Prototype (a): runs held by one worker (load {load:.1f})\n\n" +
                markdown_table(("holder", "runs held", "idle RSS MB", "RSS MB",
                                "RSS over idle MB", "KB/run", "broker MB",
                                "broker B/run", "send + take in s",
                                "re-publish/s owed (1 h visibility)"), table) + "\n")
    data = {"benchmark": "proto_hold", "load": load, "rows": rows, "markdown": markdown}
    write_json("proto_hold.json", data)
    print(markdown)
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
