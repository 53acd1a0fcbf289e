"""This package against its peers, no-op tasks in one worker: throughput and lock-store cost.

Starts two private redis-servers, one for the broker (database 0), the result backend (1)
and the benchmark's counters (3), one for the lock store alone, so that its counts are the
locks' and nothing else; and one real ``celery worker`` (prefork ``--concurrency 2`` by
default, or ``--pool solo``; no gossip, mingle or heartbeat) on
``benchmarks/peers_app.py``. Its no-op tasks, one argument each, unique per run:

* ``plain``: a plain task;
* ``slots``: ``LimitedTask(lock_slots=1000)``, never contended;
* ``rate``: ``LimitedTask(lock_rate="100000/s", lock_burst=100)``, never refused;
* ``unique``: a plain task made unique at enqueue by ``redislock_limits`` (its lock is
  taken by the sender, as the peers' are);
* ``once``: celery-once's ``QueueOnce`` (its lock is taken by the sender);
* ``singleton``: celery-singleton's ``Singleton`` (likewise).

each twice: storing no result (``ignored``) and storing it (``stored``: the sender then
also fetches every result, with one ``MGET``, before the batch ends). A batch sends
``--tasks`` runs of one task at once and times them from the first send until the worker
has counted them all (and, stored, the results were fetched). Each round runs every kind
in both modes, kinds rotated so that none always goes first; each batch is divided by the
``plain`` batches run just before and just after it (plain, A, plain, B, plain...), and
the report gives the medians of those ratios over the rounds, with the lock store's
cost per task: round trips (requests read, ``total_reads_processed``), commands
(``INFO commandstats``, script-inner commands included) and CPU (``used_cpu_*``), and
the worker's and sender's CPU (needs ``psutil``).

Batches of 2,000 by default (``--tasks``). The worker's main process spends about
800 µs of CPU on a plain no-op task, so a batch of a few hundred lasts well under half
a second, and what does not grow with the batch weighs on its ratio: the sender's first
messages before the worker has work for both processes, the last ones draining while a
process idles, the counter's 2 ms poll, and any moment of other work on the machine,
which one short batch takes whole while its plain neighbours miss it. At 2,000 a batch
lasts a second or more and those costs are a fourth as large against it.

Run from the repository root::

    python -m benchmarks.bench_peers --tasks 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import redis

from celery_redislock.testing import RedisServer

from . import fake_store
from .bench_rate import rotated
from .bench_task_overhead import CpuMeter, Worker, wait_for_count
from .common import calls_delta, environment, markdown_table, median, server_counters, write_json

PEERS_APP = "benchmarks.peers_app"
BROKER_DB, BACKEND_DB, COUNTER_DB = 0, 1, 3
#: Where Celery's Redis backend keeps a task's result.
RESULT_PREFIX = "celery-task-meta-"


@dataclass
class Batch:
    """One timed batch: ``tasks`` runs of ``kind`` in ``mode``, in round ``round``."""

    kind: str
    mode: str
    round: int
    tasks: int
    send_seconds: float
    total_seconds: float
    lock_round_trips_per_task: float
    lock_commands_per_task: float
    lock_cpu_microseconds_per_task: float
    lock_commands: Dict[str, int]
    cpu_microseconds_per_task: Dict[str, float]
    #: Throughput over the plain batches on either side of it (geometric mean).
    ratio: float = 1.0
    #: The plain batches' CPU per task (every process) over this batch's, likewise.
    cpu_ratio: float = 1.0

    @property
    def cpu_total(self) -> float:
        """CPU µs per task of every process measured (0 without ``psutil``)."""
        return self.cpu_microseconds_per_task["total"] or 1.0

    @property
    def throughput(self) -> float:
        """Tasks finished (and, stored, fetched) per second, from the first send."""
        return self.tasks / self.total_seconds


def peers_env(main: RedisServer, lock: RedisServer, sender: bool) -> Dict[str, str]:
    """The worker's (or, ``sender``, the sending process's) environment. The sender reads
    results with one ``MGET`` rather than through Celery's backend, which would subscribe
    to every task's result as it is sent."""
    env = dict(os.environ)
    env.update({
        "REDISLOCK_BENCH_BROKER_URL": main.database_url(BROKER_DB),
        "REDISLOCK_BENCH_BACKEND_URL": "disabled" if sender else main.database_url(BACKEND_DB),
        "REDISLOCK_BENCH_COUNTER_URL": main.database_url(COUNTER_DB),
        "REDISLOCK_BENCH_LOCK_URL": lock.database_url(0),
    })
    return env


def load_app(env: Dict[str, str]) -> ModuleType:
    """Import the peers app module with ``env``'s URLs."""
    os.environ.update(env)
    if PEERS_APP in sys.modules:
        return importlib.reload(sys.modules[PEERS_APP])
    return importlib.import_module(PEERS_APP)


@dataclass
class Bench:
    """What every batch uses: the app module, the clients, the worker, the CPU meter."""

    app: ModuleType
    counters: redis.Redis
    results: redis.Redis
    lock: redis.Redis
    worker: Worker
    cpu: CpuMeter
    timeout: float


def fetch_results(client: redis.Redis, ids: List[str]) -> int:
    """Read every result of ``ids`` with one ``MGET``; how many were there."""
    found = client.mget([RESULT_PREFIX + task_id for task_id in ids])
    return sum(value is not None for value in found)


def run_batch(bench: Bench, kind: str, mode: str, tasks: int, round_index: int) -> Batch:
    """Send ``tasks`` runs of ``kind`` in ``mode`` at once and time them to the end."""
    name = bench.app.task_name(kind, mode)
    task = bench.app.app.tasks[name]
    key = bench.app.counter_key(name)
    bench.counters.set(key, 0)
    run = uuid.uuid4().hex[:8]
    before, cpu_before = server_counters(bench.lock), bench.cpu.read()
    started = time.perf_counter()
    with bench.app.app.producer_or_acquire() as producer:
        ids = [task.apply_async((f"{run}-{i}",), producer=producer).id for i in range(tasks)]
    sent = time.perf_counter()
    wait_for_count(bench.counters, key, tasks, time.monotonic() + bench.timeout, bench.worker)
    if mode == "stored":
        fetched = fetch_results(bench.results, ids)
        if fetched != tasks:
            raise RuntimeError(f"{name}: only {fetched} of {tasks} results were stored")
    finished = time.perf_counter()
    after, cpu_after = server_counters(bench.lock), bench.cpu.read()
    if mode == "stored":
        bench.results.delete(*(RESULT_PREFIX + task_id for task_id in ids))
    delta = calls_delta(before["calls"], after["calls"])
    return Batch(
        kind=kind, mode=mode, round=round_index, tasks=tasks, send_seconds=sent - started,
        total_seconds=finished - started,
        lock_round_trips_per_task=(after["reads"] - before["reads"] - 1) / tasks,
        lock_commands_per_task=sum(delta.values()) / tasks,
        lock_cpu_microseconds_per_task=(after["cpu"] - before["cpu"]) * 1e6 / tasks,
        lock_commands=delta,
        cpu_microseconds_per_task=CpuMeter.per_task(cpu_before, cpu_after, tasks),
    )


def run_rounds(bench: Bench, args: argparse.Namespace) -> List[Batch]:
    """Warm every task up, then ``--rounds`` rounds. A round runs, in each mode, every
    other kind (rotated) between two plain batches: plain, A, plain, B, plain..., and
    divides each by the geometric mean of the plain batches on either side of it, so
    that the machine's drift cancels out of its ratio."""
    kinds = [kind for kind in chosen_kinds(bench.app, args) if kind != bench.app.PLAIN]
    modes = chosen_modes(bench.app, args)
    for mode in modes:
        for kind in [bench.app.PLAIN, *kinds]:
            run_batch(bench, kind, mode, args.warmup, -1)
    batches = []
    for round_index in range(args.rounds):
        for mode in rotated(modes, round_index):
            plain = run_batch(bench, bench.app.PLAIN, mode, args.tasks, round_index)
            batches.append(plain)
            for kind in rotated(kinds, round_index):
                batch = run_batch(bench, kind, mode, args.tasks, round_index)
                after = run_batch(bench, bench.app.PLAIN, mode, args.tasks, round_index)
                batch.ratio = batch.throughput / math.sqrt(plain.throughput * after.throughput)
                batch.cpu_ratio = math.sqrt(plain.cpu_total * after.cpu_total) / batch.cpu_total
                batches.extend((batch, after))
                plain = after
    return batches


def chosen_kinds(app: ModuleType, args: argparse.Namespace) -> List[str]:
    """The kinds ``--kinds`` names (every kind by default), the plain task first."""
    wanted = args.kinds.split(",") if args.kinds else list(app.KINDS)
    unknown = sorted(set(wanted) - set(app.KINDS))
    if unknown:
        raise SystemExit(f"unknown kinds {unknown}: choose from {list(app.KINDS)}")
    return [app.PLAIN, *[kind for kind in app.KINDS if kind in wanted and kind != app.PLAIN]]


def chosen_modes(app: ModuleType, args: argparse.Namespace) -> List[str]:
    """The modes ``--modes`` names (both by default)."""
    wanted = args.modes.split(",") if args.modes else list(app.MODES)
    return [mode for mode in app.MODES if mode in wanted]


@contextlib.contextmanager
def started(args: argparse.Namespace) -> Iterator[Bench]:
    """The servers and the worker of ``args`` (``--pool``, ``--concurrency``,
    ``--fake-store``, ``--timeout``) started, as a :class:`Bench`; stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="redislock-bench-peers-") as scratch, \
            RedisServer() as main, RedisServer() as lock:
        app = load_app(peers_env(main, lock, sender=True))
        worker_env = peers_env(main, lock, sender=False)
        if args.fake_store:
            worker_env[fake_store.ENV] = fake_store.MODES[args.fake_store]
        worker = Worker(worker_env, args.concurrency,
                        Path(scratch) / "worker.log", app=PEERS_APP, pool=args.pool).start()
        counters = main.client(db=COUNTER_DB)
        results = main.client(db=BACKEND_DB)
        lock_client = lock.client()
        try:
            assert worker.process is not None and main.process is not None
            assert lock.process is not None
            cpu = CpuMeter(worker.process.pid, main.process.pid,
                           more={"lock_store": lock.process.pid})
            yield Bench(app, counters, results, lock_client, worker, cpu, args.timeout)
        finally:
            worker.stop()
            for client in (counters, results, lock_client):
                client.close()


def run(args: argparse.Namespace) -> Tuple[ModuleType, List[Batch], Dict[str, Any]]:
    """Start the servers and the worker, run the batches, stop everything."""
    with started(args) as bench:
        batches = run_rounds(bench, args)
        machine = environment(bench.lock)
    return bench.app, batches, machine


def summarize(batches: List[Batch], kind: str, mode: str) -> Dict[str, Any]:
    """Medians of one kind's batches in one mode, and its ratios to the plain batches."""
    mine = [batch for batch in batches if batch.kind == kind and batch.mode == mode]
    ratios = [batch.ratio for batch in mine]
    commands: Dict[str, float] = {}
    for batch in mine:
        for command, calls in batch.lock_commands.items():
            commands[command] = commands.get(command, 0.0) + calls / batch.tasks / len(mine)
    return {
        "kind": kind,
        "mode": mode,
        "tasks_per_second_median": median([batch.throughput for batch in mine]),
        "ratio_over_plain_per_round": ratios,
        "ratio_over_plain_median": median(ratios),
        "cpu_ratio_median": median([batch.cpu_ratio for batch in mine]),
        "send_seconds_median": median([batch.send_seconds for batch in mine]),
        "lock_round_trips_per_task": median([b.lock_round_trips_per_task for b in mine]),
        "lock_commands_per_task": median([b.lock_commands_per_task for b in mine]),
        "lock_commands_mean_per_task": dict(sorted(commands.items())),
        "lock_cpu_microseconds_per_task": median(
            [b.lock_cpu_microseconds_per_task for b in mine]),
        "cpu_microseconds_per_task": {
            part: median([batch.cpu_microseconds_per_task[part] for batch in mine])
            for part in mine[0].cpu_microseconds_per_task
        },
    }


def build_report(app: ModuleType, batches: List[Batch], args: argparse.Namespace,
                 machine: Dict[str, Any]) -> Dict[str, Any]:
    """The machine-readable report."""
    results = {
        mode: {kind: summarize(batches, kind, mode) for kind in chosen_kinds(app, args)}
        for mode in chosen_modes(app, args)
    }
    return {
        "benchmark": "peers",
        "tasks_per_batch": args.tasks,
        "rounds": args.rounds,
        "pool": args.pool,
        "concurrency": args.concurrency,
        "fake_store": args.fake_store,
        "kinds": chosen_kinds(app, args),
        "plain": app.PLAIN,
        "environment": machine,
        "results": results,
        "batches": [asdict(batch) | {"throughput": batch.throughput} for batch in batches],
    }


#: How the report names each kind.
LABELS = {
    "plain": "plain task",
    "slots": "LimitedTask, lock_slots",
    "rate": "LimitedTask, lock_rate",
    "unique": "plain task, redislock_limits unique",
    "once": "celery-once QueueOnce",
    "singleton": "celery-singleton Singleton",
}


#: The report's title says so when this package's admissions were granted without the
#: lock store's script (``--fake-store``).
FAKE_NOTES = {"free": " (this package with a fake lock store: --fake-store)",
              "ping": " (this package with a fake lock store after one bare round trip: "
                      "--fake-store ping)"}


def markdown_report(data: Dict[str, Any]) -> str:
    """The human-readable report printed to stdout."""
    rows = []
    for mode, results in data["results"].items():
        for kind, result in results.items():
            cpu = result["cpu_microseconds_per_task"]
            per_round = "" if kind == data["plain"] else ", ".join(
                f"{ratio:.2f}" for ratio in result["ratio_over_plain_per_round"])
            rows.append((
                LABELS.get(kind, kind), mode, f"{result['ratio_over_plain_median']:.3f}",
                per_round, f"{result['cpu_ratio_median']:.3f}",
                result["tasks_per_second_median"], cpu["total"],
                f"{result['lock_round_trips_per_task']:.2f}",
                f"{result['lock_commands_per_task']:.2f}",
                result["lock_cpu_microseconds_per_task"], cpu.get("worker_main", 0.0),
                cpu.get("worker_children", 0.0), cpu.get("sender", 0.0),
            ))
    table = markdown_table(
        ("task", "results", "tasks/s ÷ plain (median)", "÷ plain per round",
         "plain CPU ÷ its CPU (median)", "tasks/s", "CPU µs/task, all processes",
         "lock-store round trips/task", "lock-store cmds/task", "lock-store CPU µs/task",
         "worker main process CPU µs/task", "pool processes CPU µs/task",
         "sender CPU µs/task"),
        rows,
    )
    commands = "\n".join(
        f"- {LABELS.get(kind, kind)}, {mode}: " + ", ".join(
            f"{name} {calls:.2f}" for name, calls in result["lock_commands_mean_per_task"].items()
        )
        for mode, results in data["results"].items() for kind, result in results.items()
        if result["lock_commands_mean_per_task"]
    )
    return (
        f"## Peers: no-op tasks, {data['tasks_per_batch']} per batch x {data['rounds']} "
        f"rounds, {data['pool']} -c {data['concurrency']}"
        f"{FAKE_NOTES.get(data.get('fake_store') or '', '')}"
        f"\n\n{table}\n\n"
        "Ratios: each batch over the plain batches just before and after it (geometric "
        "mean), medians over the rounds. CPU: user + system time per task of the worker, "
        "the sender and both redis-servers, the plain batches' over the kind's (1 costs "
        "what a plain task costs; on a machine where CPU sets the pace, the throughput "
        "ratio it would reach). The peers take "
        "their lock in the sender (`apply_async`) and release it in the worker; this "
        "package does both in the worker.\n\n"
        f"Lock-store commands per task (means, script-inner commands included):\n\n"
        f"{commands}\n"
    )


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000,
                        help="tasks per batch (see the module: fewer scatter more)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every batch")
    parser.add_argument("--warmup", type=int, default=100, help="untimed tasks per task")
    parser.add_argument("--pool", choices=("prefork", "solo"), default="prefork",
                        help="the worker's pool")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per batch")
    parser.add_argument("--kinds", default="",
                        help="comma-separated kinds to run (default: all), e.g. slots,once")
    parser.add_argument("--modes", default="", help="ignored, stored or both (default)")
    parser.add_argument("--fake-store", nargs="?", const="free", default="",
                        choices=sorted(fake_store.MODES),
                        help="the worker grants this package's admissions without the lock "
                             "store (benchmarks/fake_store.py): its own share alone; 'ping': "
                             "after one bare round trip to it")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, print the markdown report, write results/peers.json."""
    args = parse_args(argv)
    if args.pool == "solo":
        args.concurrency = 1
    app, batches, machine = run(args)
    data = build_report(app, batches, args, machine)
    data["markdown"] = markdown_report(data)
    path = write_json("peers.json", data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
