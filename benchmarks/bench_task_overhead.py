"""Throughput of a never-contended no-op ``LimitedTask`` versus a plain no-op task.

Starts a private redis-server (broker, result backend and lock store) and a real
``celery worker`` subprocess (prefork, ``--concurrency 2``, no gossip, mingle or
heartbeat). Each batch sends ``--tasks`` tasks of one kind at once and measures the time
from the first send until the worker has finished them all (every finished run
increments a counter, which is polled). Batches alternate plain, limited, plain, limited
in the same worker; the median of each kind and the ratio limited/plain are reported.

With ``--floors``, each round also times three more no-op tasks (see
``benchmarks/worker_app.py``): one that makes a single round trip to the lock store, one
that makes a limited run's Redis calls with the same arguments to a script that only
reads the clock, and one that makes exactly a limited run's Redis calls with none of the
package's code around them. Their ratios to the plain task are the floors that the design
(one admission script call per run) and the package's code stand on.

Run from the repository root::

    python -m benchmarks.bench_task_overhead --tasks 2000 --rounds 5
    python -m benchmarks.bench_task_overhead --tasks 2000 --rounds 10 --floors
"""

from __future__ import annotations

import argparse
import importlib
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

import redis

try:
    import psutil
except ImportError:  # CPU accounting is optional
    psutil = None

from celery_redislock.testing import RedisServer

from .common import calls_delta, command_calls, environment, markdown_table, median, write_json

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER_APP = "benchmarks.worker_app"

BROKER_DB, BACKEND_DB, LOCK_DB = 0, 1, 2
POLL_INTERVAL = 0.002
WORKER_STOP_TIMEOUT = 30.0


class CpuMeter:
    """CPU seconds used so far by the worker's main process, its children, redis-server and
    this (sending) process: where a batch's CPU went. Needs ``psutil``; without it, zeros."""

    PARTS = ("worker_main", "worker_children", "redis_server", "sender")

    def __init__(self, worker_pid: int, redis_pid: int,
                 more: Optional[Dict[str, int]] = None) -> None:
        self.worker_pid = worker_pid
        self.redis_pid = redis_pid
        #: Further processes to account for, by part name (e.g. a second redis-server).
        self.more = dict(more or {})

    def read(self) -> Dict[str, float]:
        """Cumulative CPU seconds (user + system) of each part."""
        used = dict.fromkeys((*self.PARTS, *self.more), 0.0)
        used["sender"] = time.process_time()
        if psutil is None:
            return used
        main = psutil.Process(self.worker_pid)
        used["worker_main"] = _cpu_seconds(main)
        used["worker_children"] = sum(_cpu_seconds(child) for child in main.children(True))
        used["redis_server"] = _cpu_seconds(psutil.Process(self.redis_pid))
        for part, pid in self.more.items():
            used[part] = _cpu_seconds(psutil.Process(pid))
        return used

    @staticmethod
    def per_task(before: Dict[str, float], after: Dict[str, float],
                 tasks: int) -> Dict[str, float]:
        """CPU microseconds per task of each part between two readings, and their total."""
        spent = {part: (after[part] - before[part]) * 1e6 / tasks for part in before}
        spent["total"] = sum(spent.values())
        return spent


def _cpu_seconds(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@dataclass
class Batch:
    """One timed batch: ``tasks`` runs of ``kind``."""

    kind: str
    tasks: int
    send_seconds: float
    total_seconds: float
    lock_scripts_per_task: float
    server_commands_per_task: float
    cpu_microseconds_per_task: Dict[str, float]

    @property
    def throughput(self) -> float:
        """Tasks finished per second, from first send to last completion."""
        return self.tasks / self.total_seconds


class Worker:
    """A ``celery worker`` subprocess of the app module ``app``, in its own process group,
    with its log in a file."""

    def __init__(self, env: Dict[str, str], concurrency: int, log_path: Path,
                 app: str = WORKER_APP, loglevel: str = "WARNING",
                 pool: str = "prefork") -> None:
        self.env = env
        self.pool = pool
        self.concurrency = concurrency
        self.log_path = log_path
        self.app = app
        self.loglevel = loglevel
        self.process: Optional[subprocess.Popen[bytes]] = None

    def command(self) -> List[str]:
        """The worker's command line."""
        return [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "--pool", self.pool, "--concurrency", str(self.concurrency),
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", self.loglevel, "--hostname", f"bench-{uuid.uuid4().hex[:8]}@%h",
        ]

    def start(self) -> Worker:
        """Start the worker (readiness is checked by the warm-up batches)."""
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, env=self.env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self

    def check_alive(self) -> None:
        """Raise, with the end of the worker's log, if the worker has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the celery worker exited early:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the worker's log."""
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        """Warm shutdown (SIGTERM); if that takes longer than ``timeout``, kill its group."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the group holds only this worker
            process.wait(timeout=timeout)


def load_app(env: Dict[str, str]) -> ModuleType:
    """Import the benchmark's Celery app module with ``env``'s URLs."""
    os.environ.update(env)
    return importlib.import_module(WORKER_APP)


def wait_for_count(client: redis.Redis, key: str, expected: int, deadline: float,
                   worker: Worker) -> None:
    """Poll ``key`` until it reaches ``expected``; raise at ``deadline`` or if the worker died."""
    while int(client.get(key) or 0) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {int(client.get(key) or 0)} of {expected} tasks finished in time\n"
                f"{worker.log_tail()}"
            )
        worker.check_alive()
        time.sleep(POLL_INTERVAL)


def run_batch(bench: ModuleType, client: redis.Redis, worker: Worker, cpu: CpuMeter,
              kind: str, tasks: int, timeout: float) -> Batch:
    """Send ``tasks`` runs of task ``kind`` at once and time them until all have finished."""
    task = bench.app.tasks[kind]
    key = bench.counter_key(kind)
    client.set(key, 0)
    calls_before = command_calls(client)
    cpu_before = cpu.read()
    started = time.perf_counter()
    with bench.app.producer_or_acquire() as producer:
        for _ in range(tasks):
            task.apply_async(producer=producer)
    sent = time.perf_counter()
    wait_for_count(client, key, tasks, time.monotonic() + timeout, worker)
    finished = time.perf_counter()
    cpu_after = cpu.read()
    # Every worker child does its INCR after its run; the polling adds only GETs.
    delta = calls_delta(calls_before, command_calls(client), ignore=("get",))
    lock_scripts = delta.get("evalsha", 0) + delta.get("eval", 0)
    return Batch(
        kind=kind, tasks=tasks, send_seconds=sent - started, total_seconds=finished - started,
        lock_scripts_per_task=lock_scripts / tasks,
        server_commands_per_task=sum(delta.values()) / tasks,
        cpu_microseconds_per_task=CpuMeter.per_task(cpu_before, cpu_after, tasks),
    )


def labels(bench: ModuleType) -> Dict[str, str]:
    """How the report names each task kind of the app module ``bench``."""
    return {bench.PLAIN: "plain", bench.LIMITED: "limited",
            bench.ROUND_TRIP: "one round trip", bench.SCRIPT_CALL: "script call",
            bench.BARE_ADMISSION: "bare admission"}


def kinds_of(bench: ModuleType, args: argparse.Namespace) -> List[str]:
    """The task kinds each round times, in order: plain and limited, then the floors."""
    floors = [bench.ROUND_TRIP, bench.SCRIPT_CALL, bench.BARE_ADMISSION] if args.floors else []
    return [bench.PLAIN, bench.LIMITED, *floors]


def run_rounds(bench: ModuleType, client: redis.Redis, worker: Worker, cpu: CpuMeter,
               args: argparse.Namespace) -> List[Batch]:
    """Warm up every kind, then alternate timed batches: plain, limited (and the floors),
    plain, limited..."""
    kinds = kinds_of(bench, args)
    for kind in kinds:
        run_batch(bench, client, worker, cpu, kind, args.warmup, args.timeout)
    batches = []
    for _ in range(args.rounds):
        for kind in kinds:
            batches.append(
                run_batch(bench, client, worker, cpu, kind, args.tasks, args.timeout)
            )
    return batches


def summarize(batches: List[Batch], kind: str) -> Dict[str, Any]:
    """Median throughput and the spread of one kind's batches."""
    mine = [batch for batch in batches if batch.kind == kind]
    rates = [batch.throughput for batch in mine]
    return {
        "kind": kind,
        "tasks_per_second_median": median(rates),
        "tasks_per_second_per_batch": rates,
        "microseconds_per_task": 1e6 / median(rates),
        "send_seconds_median": median([batch.send_seconds for batch in mine]),
        "total_seconds_median": median([batch.total_seconds for batch in mine]),
        "lock_scripts_per_task": median([batch.lock_scripts_per_task for batch in mine]),
        "server_commands_per_task": median([batch.server_commands_per_task for batch in mine]),
        "cpu_microseconds_per_task": {
            part: median([batch.cpu_microseconds_per_task[part] for batch in mine])
            for part in mine[0].cpu_microseconds_per_task
        },
    }


def profile_summary(directory: Path, sort: str = "cumulative", limit: int = 40) -> str:
    """The merged cProfile statistics of the worker children, sorted by ``sort``."""
    files = sorted(str(path) for path in directory.glob("*.prof"))
    if not files:
        return "(no worker profiles were written)"
    stats = pstats.Stats(*files, stream=_StringStream())
    stats.sort_stats(sort).print_stats(limit)
    return stats.stream.text  # type: ignore[attr-defined]


class _StringStream:
    """A minimal writable stream that keeps what ``pstats`` prints."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)


def worker_env(server: RedisServer, store_results: bool, profile_dir: Optional[Path],
               profile_clock: str = "wall") -> Dict[str, str]:
    """Environment of the worker (and of the sender's app) pointing at ``server``."""
    env = dict(os.environ)
    env.update({
        "REDISLOCK_BENCH_BROKER_URL": server.database_url(BROKER_DB),
        "REDISLOCK_BENCH_BACKEND_URL": server.database_url(BACKEND_DB),
        "REDISLOCK_BENCH_LOCK_URL": server.database_url(LOCK_DB),
        "REDISLOCK_BENCH_IGNORE_RESULT": "0" if store_results else "1",
    })
    if profile_dir is not None:
        env["REDISLOCK_BENCH_PROFILE_DIR"] = str(profile_dir)
        env["REDISLOCK_BENCH_PROFILE_CLOCK"] = profile_clock
    else:
        env.pop("REDISLOCK_BENCH_PROFILE_DIR", None)
    return env


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Start Redis and the worker, run the batches, stop both; return the report."""
    with tempfile.TemporaryDirectory(prefix="redislock-bench-worker-") as scratch, \
            RedisServer() as server:
        profile_dir = Path(scratch) / "profiles" if args.profile else None
        if profile_dir is not None:
            profile_dir.mkdir()
        env = worker_env(server, args.store_results, profile_dir, args.profile_clock)
        bench = load_app(env)
        client = server.client(db=LOCK_DB)
        worker = Worker(env, args.concurrency, Path(scratch) / "worker.log").start()
        try:
            assert worker.process is not None and server.process is not None
            cpu = CpuMeter(worker.process.pid, server.process.pid)
            batches = run_rounds(bench, client, worker, cpu, args)
            machine = environment(client)
        finally:
            worker.stop()
            client.close()
        profile = (profile_summary(profile_dir, args.profile_sort)
                   if profile_dir is not None else None)
    return build_report(bench, batches, args, machine, profile)


def build_report(bench: ModuleType, batches: List[Batch], args: argparse.Namespace,
                 machine: Dict[str, Any], profile: Optional[str]) -> Dict[str, Any]:
    """The machine-readable report, with the ratio against the target."""
    results = {kind: summarize(batches, kind) for kind in kinds_of(bench, args)}
    plain, limited = results[bench.PLAIN], results[bench.LIMITED]
    ratio = limited["tasks_per_second_median"] / plain["tasks_per_second_median"]
    # Each limited batch against the plain batch of its round: the machine's drift over
    # the run (other load, CPU frequency) cancels out of these.
    pairs = _paired_ratios(batches, bench.PLAIN, bench.LIMITED)
    label = labels(bench)
    data: Dict[str, Any] = {
        "benchmark": "task_overhead",
        "tasks_per_batch": args.tasks,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "store_results": args.store_results,
        "environment": machine,
        "results": {label[kind]: result for kind, result in results.items()},
        "ratio_over_plain_per_kind": {
            label[kind]: result["tasks_per_second_median"]
            / plain["tasks_per_second_median"]
            for kind, result in results.items() if kind != bench.PLAIN
        },
        "ratio_over_plain_per_round": {
            label[kind]: _paired_ratios(batches, bench.PLAIN, kind)
            for kind in results if kind != bench.PLAIN
        },
        "batches": [asdict(batch) | {"throughput": batch.throughput} for batch in batches],
        "ratio_limited_over_plain": ratio,
        "ratio_per_round": pairs,
        "ratio_per_round_median": median(pairs),
        "overhead_microseconds_per_task": (
            limited["microseconds_per_task"] - plain["microseconds_per_task"]
        ),
        "target": "limited throughput >= 0.9 x plain throughput",
        "target_met": ratio >= 0.9,
    }
    if profile is not None:
        data["worker_profile"] = profile
    return data


def _paired_ratios(batches: List[Batch], base: str, kind: str) -> List[float]:
    """Each batch of ``kind`` over the ``base`` batch of the same round (rounds start
    with ``base``)."""
    ratios, last_base = [], None
    for batch in batches:
        if batch.kind == base:
            last_base = batch
        elif batch.kind == kind and last_base is not None:
            ratios.append(batch.throughput / last_base.throughput)
    return ratios


def markdown_report(data: Dict[str, Any]) -> str:
    """The human-readable report printed to stdout."""
    rows = [
        (
            name, result["tasks_per_second_median"], result["microseconds_per_task"],
            ", ".join(f"{rate:,.0f}" for rate in result["tasks_per_second_per_batch"]),
            result["send_seconds_median"], result["total_seconds_median"],
            result["lock_scripts_per_task"], result["server_commands_per_task"],
        )
        for name, result in data["results"].items()
    ]
    table = markdown_table(
        ("task", "tasks/s (median)", "µs/task", "per batch", "send s (median)",
         "total s (median)", "lock scripts/task", "server cmds/task"),
        rows,
    )
    cpu_table = markdown_table(
        ("task", *(f"{part} CPU µs/task" for part in (*CpuMeter.PARTS, "total"))),
        [
            (name, *(result["cpu_microseconds_per_task"][part]
                     for part in (*CpuMeter.PARTS, "total")))
            for name, result in data["results"].items()
        ],
    )
    ratio = data["ratio_limited_over_plain"]
    floors = ""
    if len(data["ratio_over_plain_per_kind"]) > 1:
        lines = [
            f"- {name}: {value:.3f} (per-round median "
            f"{median(data['ratio_over_plain_per_round'][name]):.3f})"
            for name, value in data["ratio_over_plain_per_kind"].items()
        ]
        floors = ("Throughput over plain, same run, with the floors (see --floors):\n\n"
                  + "\n".join(lines) + "\n\n")
    return (
        f"## LimitedTask vs plain task ({data['tasks_per_batch']} tasks x "
        f"{data['rounds']} rounds, prefork -c {data['concurrency']}, "
        f"results {'stored' if data['store_results'] else 'ignored'})\n\n{table}\n\n"
        f"Ratio limited/plain: **{ratio:.3f}** (per round: "
        f"{', '.join(f'{pair:.3f}' for pair in data['ratio_per_round'])}; their median "
        f"{data['ratio_per_round_median']:.3f}) "
        f"(target >= 0.9: {'met' if data['target_met'] else 'NOT met'}); "
        f"overhead {data['overhead_microseconds_per_task']:.0f} µs per task\n\n"
        f"{floors}"
        f"CPU time per task (medians; all processes share the machine's "
        f"{data['environment']['cpus']} CPUs):\n\n{cpu_table}\n"
    )


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per batch")
    parser.add_argument("--rounds", type=int, default=5, help="plain+limited batch pairs")
    parser.add_argument("--warmup", type=int, default=200, help="untimed tasks per kind")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per batch")
    parser.add_argument("--store-results", action="store_true",
                        help="store task results in the backend (default: ignore them)")
    parser.add_argument("--floors", action="store_true",
                        help="also time a one-round-trip task, a clock-only script call "
                             "and the bare admission")
    parser.add_argument("--profile", action="store_true",
                        help="profile the worker children with cProfile and print it")
    parser.add_argument("--profile-clock", choices=("wall", "process", "thread"),
                        default="wall", help="the profiler's clock (process/thread: CPU)")
    parser.add_argument("--profile-sort", default="cumulative",
                        help="pstats sort key of the printed profile (e.g. tottime)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, print the markdown report, write results/task_overhead.json."""
    args = parse_args(argv)
    data = run(args)
    data["markdown"] = markdown_report(data)
    name = "task_overhead_profile.json" if args.profile else "task_overhead.json"
    path = write_json(name, data)
    print(data["markdown"])
    if "worker_profile" in data:
        print(f"Worker children profile ({args.profile_clock} clock, by {args.profile_sort}):"
              "\n\n```\n"
              + data["worker_profile"] + "\n```")
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
