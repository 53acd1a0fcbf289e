"""Slot utilisation, fairness and waits under contention, in real workers.

Starts two private redis-servers, one for the broker (database 0), the result backend
(1) and the benchmark's records (2), one for the lock store alone, and ``--workers``
real ``celery worker`` subprocesses (prefork, ``--concurrency 3`` each, no gossip,
mingle or heartbeat) on ``benchmarks/contention_app.py``. A batch sends a backlog of K
tasks at once, each of which sleeps d seconds inside one of N slots of a fresh key, in
one of two modes:

* ``package``: ``LimitedTask`` with ``lock_slots=N`` and every other setting at its
  default (the package re-queues runs that find no free slot);
* ``baseline``: a plain task that takes the package's ``Semaphore`` without blocking and
  otherwise calls ``self.retry(countdown=FIXED)`` (FIXED = 1 s; the task has
  ``max_retries=None``, so it retries until it gets a slot).

Reported per scenario and mode (medians over ``--rounds`` batches):

* utilisation = (K·d/N) / (last end - first start), and the makespan;
* peak concurrency (must be <= N) and runs per task (must be exactly 1);
* worst overtaking: for each task, how many tasks that first asked later (first reached
  a pool process later) started before it; the max over tasks;
* wait p50 / p99, from a task's first ask to the start of its body;
* hand-off gaps: how long a freed slot stayed empty before the next start (p50, max);
* Redis commands per task on the lock store (``INFO commandstats`` deltas of its own
  server, so the broker's and the records' commands are not in it), and broker
  publishes per task (``LPUSH``: the first send plus every re-queue or retry).

Run from the repository root::

    python -m benchmarks.bench_contention                       # short, long, overload
    python -m benchmarks.bench_contention --scenarios short --rounds 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence

import redis

from celery_redislock.testing import RedisServer

from .bench_rate import check_alive, rotated, wait_until_ready
from .bench_task_overhead import Worker
from .common import calls_delta, command_calls, environment, markdown_table, median, write_json
from .contention_metrics import batch_measures

CONTENTION_APP = "benchmarks.contention_app"
BROKER_DB, BACKEND_DB, RECORD_DB, LOCK_DB = 0, 1, 2, 0
POLL_INTERVAL = 0.02
READY_TIMEOUT = 60.0
#: After the last record, how long to wait before reading the counters (late releases).
SETTLE_SECONDS = 0.3
#: Commands the benchmark's own records and polls send to the broker's server.
RECORD_COMMANDS = ("rpush", "set", "llen", "lrange", "mget", "del", "get", "time")
MODES = ("package", "baseline")
TARGETS = {"short": 0.95, "long": 0.98}
RESULTS_FILE = "contention.json"


@dataclass(frozen=True)
class Scenario:
    """K tasks of d seconds each on N slots."""

    name: str
    duration: float
    tasks: int

    def label(self, slots: int) -> str:
        """How the scenario is shown in reports."""
        return f"{self.name} (d={self.duration:g} s, N={slots}, K={self.tasks})"


SCENARIOS = {
    "short": Scenario("short", 0.2, 30),
    "long": Scenario("long", 2.0, 30),
    "overload": Scenario("overload", 0.1, 60),
}


def contention_env(broker: RedisServer, lock: RedisServer, slots: int,
                   countdown: float) -> Dict[str, str]:
    """Environment of the workers (and of the sender's app) pointing at the two servers."""
    env = dict(os.environ)
    env.update({
        "REDISLOCK_BENCH_BROKER_URL": broker.database_url(BROKER_DB),
        "REDISLOCK_BENCH_BACKEND_URL": broker.database_url(BACKEND_DB),
        "REDISLOCK_BENCH_RECORD_URL": broker.database_url(RECORD_DB),
        "REDISLOCK_BENCH_LOCK_URL": lock.database_url(LOCK_DB),
        "REDISLOCK_BENCH_SLOTS": str(slots),
        "REDISLOCK_BENCH_RETRY_COUNTDOWN": repr(countdown),
    })
    return env


def load_app(env: Dict[str, str]) -> ModuleType:
    """Import (or re-import) the contention app module with ``env``'s settings."""
    os.environ.update(env)
    if CONTENTION_APP in sys.modules:
        return importlib.reload(sys.modules[CONTENTION_APP])
    return importlib.import_module(CONTENTION_APP)


def send_backlog(task: Any, run: str, tasks: int, duration: float) -> None:
    """Send ``tasks`` runs of ``task`` at once on one producer connection."""
    with task.app.producer_or_acquire() as producer:
        for seq in range(tasks):
            task.apply_async((run, seq, duration), producer=producer)


def wait_for_records(records: redis.Redis, key: str, expected: int, deadline: float,
                     workers: Sequence[Worker]) -> None:
    """Poll the length of the list ``key`` until it reaches ``expected``."""
    while records.llen(key) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {records.llen(key)} of {expected} runs finished in time\n"
                f"{workers[0].log_tail()}"
            )
        check_alive(workers)
        time.sleep(POLL_INTERVAL)


def read_records(records: redis.Redis, run: str, bench: ModuleType) -> List[Dict[str, Any]]:
    """Batch ``run``'s run records, each with its task's first-ask time."""
    rows = [json.loads(raw) for raw in records.lrange(bench.records_key(run), 0, -1)]
    keys = [bench.first_ask_key(row["task_id"]) for row in rows]
    firsts = records.mget(keys) if keys else []
    for row, first in zip(rows, firsts):
        row["first_ask"] = float(first) if first is not None else row["start"]
    return rows


def run_batch(bench: ModuleType, scenario: Scenario, mode: str, round_index: int,
              lock_client: redis.Redis, broker_client: redis.Redis,
              records: redis.Redis, workers: Sequence[Worker], slots: int,
              timeout: float) -> Dict[str, Any]:
    """Send one backlog in ``mode`` and measure it once every run has recorded."""
    task = bench.app.tasks[bench.LIMITED if mode == "package" else bench.BASELINE]
    run = f"{scenario.name}-{mode}-{uuid.uuid4().hex[:8]}"
    lock_before, broker_before = command_calls(lock_client), command_calls(broker_client)
    sent_at = time.time()
    send_backlog(task, run, scenario.tasks, scenario.duration)
    ideal = scenario.tasks * scenario.duration / slots
    wait_for_records(records, bench.records_key(run), scenario.tasks,
                     time.monotonic() + timeout + 10 * ideal, workers)
    time.sleep(SETTLE_SECONDS)
    lock_delta = calls_delta(lock_before, command_calls(lock_client))
    broker_delta = calls_delta(broker_before, command_calls(broker_client),
                               ignore=RECORD_COMMANDS)
    rows = read_records(records, run, bench)
    measures = batch_measures(rows, scenario.duration, slots)
    return {
        "scenario": scenario.name,
        "mode": mode,
        "round": round_index,
        "run": run,
        "tasks": scenario.tasks,
        "duration": scenario.duration,
        "slots": slots,
        "sent_at": sent_at,
        **measures,
        "lock_commands_per_task": sum(lock_delta.values()) / scenario.tasks,
        "lock_commands": lock_delta,
        "broker_publishes_per_task": broker_delta.get("lpush", 0) / scenario.tasks,
        "processes_used": len({(row["worker"], row["pid"]) for row in rows}),
        "records": rows,
    }


def count_runs(records: redis.Redis, bench: ModuleType,
               batches: List[Dict[str, Any]]) -> None:
    """At the end, count each batch's runs per task again (a late duplicate shows now)."""
    for batch in batches:
        rows = [json.loads(raw) for raw in records.lrange(bench.records_key(batch["run"]), 0, -1)]
        per_task: Dict[str, int] = {}
        for row in rows:
            per_task[row["task_id"]] = per_task.get(row["task_id"], 0) + 1
        batch["runs_per_task_max"] = max(per_task.values())
        batch["runs_per_task_min"] = min(per_task.values())
        batch["tasks_recorded"] = len(per_task)


def warm_up(bench: ModuleType, records: redis.Redis, workers: Sequence[Worker],
            tasks: int, timeout: float) -> None:
    """Short untimed runs, so every pool process has connected before the first batch."""
    run = "warmup-" + uuid.uuid4().hex[:8]
    send_backlog(bench.app.tasks[bench.WARMUP], run, tasks, 0.0)
    wait_for_records(records, bench.records_key(run), tasks, time.monotonic() + timeout,
                     workers)
    for mode_task in (bench.LIMITED, bench.BASELINE):  # one uncontended run of each
        warm = f"warm-{mode_task}-{uuid.uuid4().hex[:8]}"
        bench.app.tasks[mode_task].apply_async((warm, 0, 0.0))
        wait_for_records(records, bench.records_key(warm), 1, time.monotonic() + timeout,
                         workers)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Start both servers and the workers, run the batches, stop everything."""
    scenarios = [SCENARIOS[name] for name in args.scenarios.split(",") if name]
    with tempfile.TemporaryDirectory(prefix="redislock-bench-contention-") as scratch, \
            RedisServer() as broker, RedisServer() as lock:
        env = contention_env(broker, lock, args.slots, args.retry_countdown)
        bench = load_app(env)
        lock_client = lock.client(db=LOCK_DB)
        broker_client = broker.client(db=BROKER_DB)
        records = broker.client(db=RECORD_DB)
        workers = [
            Worker(env, args.concurrency, Path(scratch) / f"worker{index}.log",
                   app=CONTENTION_APP).start()
            for index in range(args.workers)
        ]
        try:
            wait_until_ready(bench, workers, READY_TIMEOUT)
            warm_up(bench, records, workers, 6 * args.workers * args.concurrency,
                    args.timeout)
            batches = []
            for round_index in range(args.rounds):
                for scenario in scenarios:
                    for mode in rotated(MODES, round_index):
                        batches.append(run_batch(
                            bench, scenario, mode, round_index, lock_client, broker_client,
                            records, workers, args.slots, args.timeout,
                        ))
                        print(f"  {scenario.name:8} {mode:8} round {round_index}: "
                              f"utilisation {batches[-1]['utilisation']:.3f}",
                              file=sys.stderr, flush=True)
            time.sleep(args.duplicate_grace)
            count_runs(records, bench, batches)
            machine = environment(lock_client)
        finally:
            for worker in workers:
                worker.stop()
            for client in (lock_client, broker_client, records):
                client.close()
    return build_report(scenarios, batches, args, machine)


SUMMARY_FIELDS = (
    "utilisation", "makespan_s", "worst_overtaking", "worst_overtaking_by_send_order",
    "wait_p50_s", "wait_p99_s", "handoff_gap_p50_s", "handoff_gap_p90_s", "handoff_gap_max_s",
    "ramp_up_s", "lock_commands_per_task", "broker_publishes_per_task",
)


#: The hand-off gap's three parts (p50 per batch): end → delivery → admission → body.
HANDOFF_PARTS = (
    "handoff_to_delivery_p50_s", "handoff_to_admission_p50_s", "handoff_to_body_p50_s",
)


def summarize(batches: List[Dict[str, Any]], scenario: Scenario, mode: str,
              slots: int) -> Dict[str, Any]:
    """Medians over one scenario and mode's batches; worst cases over all of them."""
    mine = [b for b in batches if b["scenario"] == scenario.name and b["mode"] == mode]
    summary: Dict[str, Any] = {f: median([b[f] for b in mine]) for f in SUMMARY_FIELDS}
    for field in HANDOFF_PARTS:
        known = [b[field] for b in mine if b.get(field) is not None]
        summary[field] = median(known) if known else None
    summary.update({
        "label": scenario.label(slots),
        "batches": len(mine),
        "utilisation_per_batch": [b["utilisation"] for b in mine],
        "peak_concurrency": max(b["peak_concurrency"] for b in mine),
        "worst_overtaking_max": max(b["worst_overtaking"] for b in mine),
        "runs_per_task_min": min(b["runs_per_task_min"] for b in mine),
        "runs_per_task_max": max(b["runs_per_task_max"] for b in mine),
        "tasks_recorded_min": min(b["tasks_recorded"] for b in mine),
    })
    return summary


def build_report(scenarios: List[Scenario], batches: List[Dict[str, Any]],
                 args: argparse.Namespace, machine: Dict[str, Any]) -> Dict[str, Any]:
    """The machine-readable report, with the targets."""
    results = {
        scenario.name: {mode: summarize(batches, scenario, mode, args.slots) for mode in MODES}
        for scenario in scenarios
    }
    targets = {
        name: {"target": target, "utilisation": results[name]["package"]["utilisation"],
               "met": results[name]["package"]["utilisation"] >= target}
        for name, target in TARGETS.items() if name in results
    }
    safe = all(
        result["peak_concurrency"] <= args.slots and result["runs_per_task_min"] == 1
        and result["runs_per_task_max"] == 1
        for per_mode in results.values() for result in per_mode.values()
    )
    return {
        "benchmark": "contention",
        "workers": args.workers,
        "concurrency": args.concurrency,
        "slots": args.slots,
        "retry_countdown": args.retry_countdown,
        "rounds": args.rounds,
        "environment": machine,
        "results": results,
        "targets": targets,
        "limits_held": safe,
        "target_met": safe and all(t["met"] for t in targets.values()),
        "batches": batches,
    }


def markdown_report(data: Dict[str, Any]) -> str:
    """The human-readable report printed to stdout."""
    rows = []
    for per_mode in data["results"].values():
        for mode, r in per_mode.items():
            rows.append((
                r["label"], mode, f"{r['utilisation']:.3f}",
                ", ".join(f"{u:.3f}" for u in r["utilisation_per_batch"]),
                f"{r['peak_concurrency']} / {data['slots']}",
                f"{r['worst_overtaking']:g} ({r['worst_overtaking_by_send_order']:g})",
                f"{r['wait_p50_s']:.2f} / {r['wait_p99_s']:.2f}",
                f"{r['handoff_gap_p50_s'] * 1000:.0f} / {r['handoff_gap_max_s'] * 1000:.0f}",
                f"{r['lock_commands_per_task']:.1f}", f"{r['broker_publishes_per_task']:.1f}",
                f"{r['runs_per_task_min']}-{r['runs_per_task_max']}",
            ))
    table = markdown_table(
        ("scenario", "mode", "utilisation (median)", "per batch", "peak / N",
         "worst overtaking (by send order)", "wait p50 / p99 s", "hand-off gap p50 / max ms",
         "lock-store cmds/task", "publishes/task", "runs/task"),
        rows,
    )
    split_rows = [
        (r["label"], mode, *(_ms(r[field]) for field in HANDOFF_PARTS))
        for per_mode in data["results"].values() for mode, r in per_mode.items()
    ]
    split = markdown_table(
        ("scenario", "mode", "end → next delivery reaches a pool process",
         "→ slot taken", "→ body starts"),
        split_rows,
    )
    targets = "; ".join(
        f"{name} {t['utilisation']:.3f} (target >= {t['target']}: "
        f"{'met' if t['met'] else 'NOT met'})"
        for name, t in data["targets"].items()
    )
    return (
        f"## Utilisation and fairness under contention ({data['workers']} workers x prefork "
        f"-c {data['concurrency']}, N={data['slots']}, {data['rounds']} round(s), medians)\n\n"
        f"{table}\n\n"
        f"Where a hand-off's time goes (ms, median over hand-offs, median over batches; "
        f"the run that took the freed slot):\n\n{split}\n\n"
        f"Package utilisation: {targets or 'no target scenario run'}; at most N at once and "
        f"every task run exactly once: **{'yes' if data['limits_held'] else 'NO'}**.\n\n"
        "`package`: `LimitedTask(lock_slots=N)`, default settings. `baseline`: plain task, "
        f"`Semaphore.acquire(blocking=False)` without blocking, else `self.retry(countdown="
        f"{data['retry_countdown']:g})`. Waits are from a task's first delivery to a pool "
        "process to the start of its body; overtaking counts tasks that first asked later "
        "but started earlier (in brackets: sent later). Hand-off gap: how long a freed slot "
        "stayed empty before the next start. Lock-store commands: `INFO commandstats` of "
        "the lock store's own server (script-inner commands included); publishes: broker "
        "`LPUSH`es per task (1 = sent once, never re-queued).\n"
    )


def _ms(seconds: Optional[float]) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.1f}"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default="short,long,overload",
                        help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    parser.add_argument("--rounds", type=int, default=2, help="batches per scenario and mode")
    parser.add_argument("--workers", type=int, default=3, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=3, help="pool processes each")
    parser.add_argument("--slots", type=int, default=2, help="N, slots of the semaphore")
    parser.add_argument("--retry-countdown", type=float, default=1.0,
                        help="the baseline's fixed retry countdown, seconds")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a batch may take beyond ten times its ideal makespan")
    parser.add_argument("--duplicate-grace", type=float, default=2.0,
                        help="seconds to wait after the last batch before counting runs")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, print the markdown report, write results/contention.json."""
    args = parse_args(argv)
    data = run(args)
    data["markdown"] = markdown_report(data)
    path = write_json(RESULTS_FILE, data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
