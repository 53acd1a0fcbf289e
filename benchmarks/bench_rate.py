"""Rate-limit accuracy under a backlog, in real workers: achieved rate, windows, waits.

Starts a private redis-server (broker, result backend and lock store) and ``--workers``
real ``celery worker`` subprocesses (prefork, ``--concurrency 2`` each, no gossip,
mingle or heartbeat) on ``benchmarks/rate_app.py``. Each configured rate limits a plain
no-op task through the ``redislock_limits`` setting and ``install(app)``.

A batch sends a backlog of ``--backlog-seconds`` worth of runs of one task at once
(3 s at 20/s: 60 runs) and waits until every run has recorded its admission time (the
Redis time at which the limits admitted it). Batches rotate over the configurations for
``--rounds`` rounds; each batch has a fresh rate limiter. Reported per configuration:

* achieved rate, ``(n - 1) / (last - first admission)``, against the configured rate and
  against the ideal rate of a backlog (the first ``burst + 1`` runs start together, the
  others one interval apart);
* the most admissions in any window of one period, against ``rate + burst``;
* p50 and p99 of the wait from sending to admission;
* Redis commands per run (``INFO commandstats`` deltas, script-inner commands included,
  the benchmark's own records and polls left out) and admission attempts per run.

Run from the repository root::

    python -m benchmarks.bench_rate --rates 20/s,50/s,5/s:5 --rounds 3
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from celery_redislock.testing import RedisServer

from .bench_task_overhead import Worker
from .common import (
    RESULTS_DIR,
    calls_delta,
    command_calls,
    environment,
    markdown_table,
    median,
    write_json,
)

RATE_APP = "benchmarks.rate_app"
BROKER_DB, BACKEND_DB, RECORDS_DB = 0, 1, 2
#: The rates of ``--sweep``.
SWEEP_RATES = "1/s,5/s,10/s,20/s,30/s,50/s,75/s,100/s,200/s,500/s"
#: No backlog is shorter than this many runs (a low rate's few seconds hold very few).
MIN_BACKLOG = 6
POLL_INTERVAL = 0.01
READY_TIMEOUT = 60.0
#: Commands only the benchmark sends while a batch runs: the records and their polling.
RECORD_COMMANDS = ("xadd", "xlen")
TARGET_RATE = 0.97
LOG_DIR = RESULTS_DIR / "rate_worker_logs"


@dataclass
class Batch:
    """One batch: ``tasks`` runs of one configuration, sent at once, all admitted."""

    label: str
    tasks: int
    burst: int
    interval_ms: float
    period_ms: float
    allowed_per_window: int
    admitted_ms: List[float]
    waits_ms: List[float]
    duplicates: int
    pids: int
    server_commands_per_task: float
    lock_commands_per_task: float
    admission_attempts_per_task: float
    publishes_per_task: float
    commands: Dict[str, int]
    lock_commands: Dict[str, int]
    max_attempts: Optional[int] = None
    most_refusals_one_promise: Optional[int] = None

    @property
    def span_ms(self) -> float:
        """Time from the first admission to the last."""
        return self.admitted_ms[-1] - self.admitted_ms[0]

    @property
    def ideal_span_ms(self) -> float:
        """The shortest span the limit allows: ``burst + 1`` at once, then one per interval."""
        return max(self.tasks - self.burst - 1, 0) * self.interval_ms

    @property
    def achieved_per_second(self) -> float:
        """``(n - 1) / (last - first)``: admissions per second over the batch."""
        return (self.tasks - 1) * 1000.0 / self.span_ms if self.span_ms > 0 else math.inf

    @property
    def configured_per_second(self) -> float:
        """The configured rate, per second."""
        return 1000.0 / self.interval_ms

    @property
    def ideal_ratio(self) -> float:
        """Achieved rate over the ideal rate of this backlog (1.0: no time lost)."""
        return self.ideal_span_ms / self.span_ms if self.span_ms > 0 else math.inf

    @property
    def slip_ms_per_admission(self) -> float:
        """Time lost, on average, per admission after the burst."""
        paced = max(self.tasks - self.burst - 1, 1)
        return (self.span_ms - self.ideal_span_ms) / paced

    @property
    def worst_window(self) -> int:
        """The most admissions in any window ``[t, t + period)``."""
        return most_in_window(self.admitted_ms, self.period_ms)

    def as_dict(self) -> Dict[str, Any]:
        """Machine-readable form, with the derived numbers."""
        data = asdict(self)
        for name in ("span_ms", "ideal_span_ms", "achieved_per_second", "ideal_ratio",
                     "slip_ms_per_admission", "worst_window", "configured_per_second"):
            data[name] = getattr(self, name)
        return data


def most_in_window(times_ms: Sequence[float], period_ms: float) -> int:
    """The most of the sorted ``times_ms`` that fall in one half-open window of ``period_ms``."""
    most, first = 0, 0
    for last, time_ms in enumerate(times_ms):
        while time_ms - times_ms[first] >= period_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of non-empty ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return float(ordered[rank - 1])


def rate_env(server: RedisServer, lock: RedisServer, rates: str, trace: bool,
             prefetch: int = 0, recheck: str = "") -> Dict[str, str]:
    """Environment of the workers (and of the sender's app): broker, backend and records
    on ``server``, the lock store alone on ``lock``."""
    env = dict(os.environ)
    env.update({
        "REDISLOCK_BENCH_BROKER_URL": server.database_url(BROKER_DB),
        "REDISLOCK_BENCH_BACKEND_URL": server.database_url(BACKEND_DB),
        "REDISLOCK_BENCH_RECORDS_URL": server.database_url(RECORDS_DB),
        "REDISLOCK_BENCH_LOCK_URL": lock.database_url(0),
        "REDISLOCK_BENCH_RATES": rates,
        "REDISLOCK_BENCH_TRACE": "1" if trace else "0",
    })
    if prefetch:
        env["REDISLOCK_BENCH_PREFETCH"] = str(prefetch)
    if recheck:
        env["REDISLOCK_BENCH_RATE_RECHECK"] = recheck
    return env


def load_app(env: Dict[str, str]) -> ModuleType:
    """Import (or re-import) the rate app module with ``env``'s URLs and rates."""
    os.environ.update(env)
    if RATE_APP in sys.modules:
        return importlib.reload(sys.modules[RATE_APP])
    return importlib.import_module(RATE_APP)


def check_alive(workers: Sequence[Worker]) -> None:
    """Raise, with the worker's log, if any worker has exited."""
    for worker in workers:
        worker.check_alive()


def wait_until_ready(bench: ModuleType, workers: Sequence[Worker], timeout: float) -> None:
    """Poll with ``ping`` until every worker answers; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        replies = bench.app.control.ping(timeout=0.5) or []
        if len(replies) >= len(workers):
            return
        check_alive(workers)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {len(replies)} of {len(workers)} workers answered a ping in "
                f"{timeout:.0f} s\n{workers[0].log_tail()}"
            )


def clock_offset_ms(client: redis.Redis, samples: int = 7) -> float:
    """Redis server time minus this process's ``time.time()``, in ms (best of ``samples``).

    Sender and server share the machine's clock, so this is normally a fraction of a ms;
    measuring it keeps send times and admission times on one clock anyway.
    """
    best: Optional[Tuple[float, float]] = None
    for _ in range(samples):
        before = time.time()
        seconds, microseconds = client.time()
        after = time.time()
        offset = seconds * 1000 + microseconds / 1000 - (before + after) * 500
        if best is None or after - before < best[0]:
            best = (after - before, offset)
    assert best is not None
    return best[1]


def wait_for_records(client: redis.Redis, key: str, expected: int, deadline: float,
                     workers: Sequence[Worker]) -> None:
    """Poll the length of the stream ``key`` until it reaches ``expected``."""
    while client.xlen(key) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"only {client.xlen(key)} of {expected} runs were admitted in time\n"
                f"{workers[0].log_tail()}"
            )
        check_alive(workers)
        time.sleep(POLL_INTERVAL)


def send_backlog(task: Any, run: str, tasks: int, offset_ms: float) -> None:
    """Send ``tasks`` runs of ``task`` at once on one producer connection."""
    with task.app.producer_or_acquire() as producer:
        for _ in range(tasks):
            task.apply_async((run, time.time() * 1000 + offset_ms), producer=producer)


def read_records(client: redis.Redis, key: str) -> List[Dict[str, str]]:
    """Every record of the stream ``key``, decoded."""
    return [
        {name.decode(): value.decode() for name, value in fields.items()}
        for _, fields in client.xrange(key)
    ]


def refusal_counts(refusals: List[Dict[str, str]]) -> Tuple[int, int]:
    """From traced refusals: the most attempts one run needed, and the most refusals that
    were handed the same promised start (1 when every waiter has a start of its own)."""
    per_run = Counter(record["task_id"] for record in refusals)
    per_promise = Counter(record["promise_us"] for record in refusals)
    return (max(per_run.values(), default=0) + 1, max(per_promise.values(), default=0))


def backlog_size(config: Any, seconds: float) -> int:
    """Runs in a backlog of ``seconds`` at the configured rate (at least burst + 2, and
    :data:`MIN_BACKLOG`)."""
    rate = config.rate
    return max(config.burst + 2, MIN_BACKLOG, round(rate.count / rate.period * seconds))


def run_batch(config: Any, client: redis.Redis, lock: redis.Redis, workers: Sequence[Worker],
              bench: ModuleType, backlog_seconds: float, timeout: float) -> Batch:
    """Send one backlog of ``config``'s task and measure it once every run is admitted."""
    rate = config.rate
    tasks = backlog_size(config, backlog_seconds)
    run = uuid.uuid4().hex[:12]
    key = bench.records_key(run)
    offset = clock_offset_ms(client)
    calls_before, lock_before = command_calls(client), command_calls(lock)
    send_backlog(bench.app.tasks[config.task_name], run, tasks, offset)
    expected_seconds = tasks * rate.interval
    wait_for_records(client, key, tasks, time.monotonic() + timeout + 3 * expected_seconds,
                     workers)
    delta = calls_delta(calls_before, command_calls(client), ignore=RECORD_COMMANDS)
    lock_delta = calls_delta(lock_before, command_calls(lock))
    records = read_records(client, key)
    refusals_key = bench.refusals_key(bench.limit_name(run))
    refusals = read_records(client, refusals_key)
    client.delete(key, refusals_key)
    batch = batch_from_records(config, records, delta, lock_delta, tasks)
    if refusals:
        batch.max_attempts, batch.most_refusals_one_promise = refusal_counts(refusals)
    return batch


def batch_from_records(config: Any, records: List[Dict[str, str]], delta: Dict[str, int],
                       lock_delta: Dict[str, int], tasks: int) -> Batch:
    """The measures of one batch from its admission records and command counts."""
    rate = config.rate
    first_of_each: Dict[str, Dict[str, str]] = {}
    for record in records:
        first_of_each.setdefault(record["task_id"], record)
    kept = list(first_of_each.values())
    admitted = sorted(float(record["admitted_ms"]) for record in kept)
    return Batch(
        label=config.label,
        tasks=len(kept),
        burst=config.burst,
        interval_ms=rate.interval * 1000,
        period_ms=rate.period * 1000,
        allowed_per_window=math.floor(rate.count) + rate.burst,
        admitted_ms=admitted,
        waits_ms=[float(record["admitted_ms"]) - float(record["sent_ms"]) for record in kept],
        duplicates=len(records) - len(kept),
        pids=len({(record["worker"], record["pid"]) for record in kept}),
        server_commands_per_task=sum(delta.values()) / tasks,
        lock_commands_per_task=sum(lock_delta.values()) / tasks,
        admission_attempts_per_task=(
            lock_delta.get("evalsha", 0) + lock_delta.get("eval", 0)) / tasks,
        publishes_per_task=delta.get("lpush", 0) / tasks,
        commands=delta,
        lock_commands=lock_delta,
    )


def warm_up(bench: ModuleType, client: redis.Redis, workers: Sequence[Worker],
            tasks: int, timeout: float) -> None:
    """Run ``tasks`` runs of the fast warm-up task, so every pool child has loaded and
    connected before the first timed batch."""
    run = "warmup-" + uuid.uuid4().hex[:8]
    send_backlog(bench.app.tasks[bench.WARMUP_TASK], run, tasks, 0.0)
    wait_for_records(client, bench.records_key(run), tasks, time.monotonic() + timeout,
                     workers)
    client.delete(bench.records_key(run))


def rotated(items: Sequence[Any], by: int) -> List[Any]:
    """``items`` rotated left by ``by`` places, so no configuration always runs first."""
    shift = by % len(items)
    return list(items[shift:]) + list(items[:shift])


def run_rounds(bench: ModuleType, client: redis.Redis, lock: redis.Redis,
               workers: Sequence[Worker], args: argparse.Namespace) -> List[Batch]:
    """Warm up, then ``--rounds`` rounds of one batch per configuration, rotating."""
    warm_up(bench, client, workers, args.warmup, args.timeout)
    batches = []
    for round_index in range(args.rounds):
        for config in rotated(bench.CONFIGS, round_index):
            batches.append(
                run_batch(config, client, lock, workers, bench, args.backlog_seconds,
                          args.timeout)
            )
    return batches


def start_workers(env: Dict[str, str], args: argparse.Namespace,
                  log_dir: Path) -> List[Worker]:
    """Start ``--workers`` worker subprocesses of the rate app, each logging to a file."""
    return [
        Worker(env, args.concurrency, log_dir / f"worker{index}.log", app=RATE_APP,
               loglevel=args.loglevel).start()
        for index in range(args.workers)
    ]


def keep_logs(workers: Sequence[Worker]) -> List[str]:
    """Copy the workers' logs into the results directory; return their file names."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    names = []
    for worker in workers:
        if worker.log_path.exists():
            shutil.copyfile(worker.log_path, LOG_DIR / worker.log_path.name)
            names.append(worker.log_path.name)
    return names


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Start Redis and the workers, run the batches, stop everything; return the report."""
    with tempfile.TemporaryDirectory(prefix="redislock-bench-rate-") as scratch, \
            RedisServer() as server, RedisServer() as lock:
        env = rate_env(server, lock, args.rates, args.trace, args.prefetch_multiplier,
                       args.rate_recheck)
        bench = load_app(env)
        client = server.client(db=RECORDS_DB)
        lock_client = lock.client()
        workers = start_workers(env, args, Path(scratch))
        try:
            wait_until_ready(bench, workers, READY_TIMEOUT)
            batches = run_rounds(bench, client, lock_client, workers, args)
            machine = environment(client)
        finally:
            for worker in workers:
                worker.stop()
            client.close()
            lock_client.close()
            logs = keep_logs(workers)
    return build_report(bench, batches, args, machine, logs)


def summarize(batches: List[Batch], label: str) -> Dict[str, Any]:
    """Medians (and the spread) of one configuration's batches; the worst window of all."""
    mine = [batch for batch in batches if batch.label == label]
    ratios = [batch.ideal_ratio for batch in mine]
    worst = max(batch.worst_window for batch in mine)
    return {
        "label": label,
        "tasks": mine[0].tasks,
        "burst": mine[0].burst,
        "configured_per_second": mine[0].configured_per_second,
        "achieved_per_second_median": median([batch.achieved_per_second for batch in mine]),
        "achieved_over_configured_median": median(
            [batch.achieved_per_second / batch.configured_per_second for batch in mine]
        ),
        "achieved_over_ideal_median": median(ratios),
        "achieved_over_ideal_per_batch": ratios,
        "worst_window": worst,
        "allowed_per_window": mine[0].allowed_per_window,
        "window_ok": worst <= mine[0].allowed_per_window,
        "wait_p50_ms_median": median([percentile(batch.waits_ms, 0.5) for batch in mine]),
        "wait_p99_ms_median": median([percentile(batch.waits_ms, 0.99) for batch in mine]),
        "slip_ms_per_admission_median": median([batch.slip_ms_per_admission for batch in mine]),
        "server_commands_per_task_median": median(
            [batch.server_commands_per_task for batch in mine]
        ),
        "lock_commands_per_task_median": median(
            [batch.lock_commands_per_task for batch in mine]
        ),
        "admission_attempts_per_task_median": median(
            [batch.admission_attempts_per_task for batch in mine]
        ),
        "publishes_per_task_median": median([batch.publishes_per_task for batch in mine]),
        "max_attempts": _max_or_none([batch.max_attempts for batch in mine]),
        "most_refusals_one_promise": _max_or_none(
            [batch.most_refusals_one_promise for batch in mine]
        ),
        "duplicates": sum(batch.duplicates for batch in mine),
        "processes_used_min": min(batch.pids for batch in mine),
    }


def _max_or_none(values: Sequence[Optional[int]]) -> Optional[int]:
    """The largest of the values that are known, or None if none is."""
    known = [value for value in values if value is not None]
    return max(known) if known else None


def build_report(bench: ModuleType, batches: List[Batch], args: argparse.Namespace,
                 machine: Dict[str, Any], logs: List[str]) -> Dict[str, Any]:
    """The machine-readable report, with the targets."""
    results = {config.label: summarize(batches, config.label) for config in bench.CONFIGS}
    lowest = min(result["achieved_over_ideal_median"] for result in results.values())
    windows_ok = all(result["window_ok"] for result in results.values())
    return {
        "benchmark": "rate",
        "rates": args.rates,
        "backlog_seconds": args.backlog_seconds,
        "rounds": args.rounds,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "traced": args.trace,
        "rate_recheck": args.rate_recheck or "default",
        "limited_through": "redislock_limits + install(app), plain tasks",
        "environment": machine,
        "results": results,
        "batches": [batch.as_dict() for batch in batches],
        "lowest_achieved_over_ideal": lowest,
        "windows_ok": windows_ok,
        "target": f"achieved/ideal rate >= {TARGET_RATE} and no window over rate + burst",
        "target_met": lowest >= TARGET_RATE and windows_ok,
        "worker_logs": logs,
    }


def markdown_report(data: Dict[str, Any]) -> str:
    """The human-readable report printed to stdout."""
    rows = [
        (
            label, result["tasks"], result["achieved_per_second_median"],
            f"{result['achieved_over_configured_median']:.3f}",
            f"{result['achieved_over_ideal_median']:.3f}",
            ", ".join(f"{ratio:.3f}" for ratio in result["achieved_over_ideal_per_batch"]),
            f"{result['worst_window']} / {result['allowed_per_window']}",
            result["wait_p50_ms_median"], result["wait_p99_ms_median"],
            result["slip_ms_per_admission_median"],
            result["admission_attempts_per_task_median"],
            result["lock_commands_per_task_median"],
            result["server_commands_per_task_median"],
        )
        for label, result in data["results"].items()
    ]
    table = markdown_table(
        ("rate", "tasks", "achieved/s", "÷ configured", "÷ ideal (median)",
         "÷ ideal per batch", "worst window / allowed", "wait p50 ms", "wait p99 ms",
         "slip ms/admission", "admission attempts/task", "lock-store cmds/task",
         "broker cmds/task"),
        rows,
    )
    if data["traced"]:
        table += "\n\nTraced refusals (the tracing itself slows the workers a little):\n\n"
        table += markdown_table(
            ("rate", "most attempts of one run", "most refusals handed one promised start"),
            [(label, result["max_attempts"], result["most_refusals_one_promise"])
             for label, result in data["results"].items()],
        )
    status = "met" if data["target_met"] else "NOT met"
    return (
        f"## Rate-limit accuracy under a backlog ({data['workers']} workers x prefork "
        f"-c {data['concurrency']}, backlog {data['backlog_seconds']:g} s of runs sent at "
        f"once, {data['rounds']} rounds, medians"
        + ("" if data["rate_recheck"] == "default"
           else f", redislock_rate_recheck {data['rate_recheck']}")
        + f")\n\n{table}\n\n"
        f"Lowest achieved/ideal rate: **{data['lowest_achieved_over_ideal']:.3f}**; "
        f"windows within rate + burst: **{'yes' if data['windows_ok'] else 'NO'}** "
        f"(target >= {TARGET_RATE} and no window over: {status})\n\n"
        "Ideal: the first `burst` runs start together, the others one interval apart. "
        "Slip: time lost per admission beyond that. Waits are from sending to admission; "
        "the whole backlog is sent at once, so most of a wait is the run's place in line.\n"
    )


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="20/s,50/s,5/s:5",
                        help="comma-separated rates, each RATE or RATE:BURST")
    parser.add_argument("--sweep", action="store_true",
                        help=f"measure the rates {SWEEP_RATES} (instead of --rates)")
    parser.add_argument("--backlog-seconds", type=float, default=3.0,
                        help="each backlog holds this many seconds of runs at its rate")
    parser.add_argument("--rounds", type=int, default=3, help="batches per configuration")
    parser.add_argument("--workers", type=int, default=3, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="pool processes each")
    parser.add_argument("--warmup", type=int, default=60, help="untimed warm-up runs")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds a batch may take beyond three times its ideal span")
    parser.add_argument("--loglevel", default="WARNING",
                        help="the workers' log level (INFO shows every re-queued run)")
    parser.add_argument("--prefetch-multiplier", type=int, default=0,
                        help="the workers' worker_prefetch_multiplier (default: Celery's)")
    parser.add_argument("--rate-recheck", default="",
                        help="the workers' redislock_rate_recheck: seconds, or 'none' "
                             "(runs ask again only at their promised start); default: "
                             "the package's")
    parser.add_argument("--trace", action="store_true",
                        help="record every refusal and its promised start (slows the "
                             "workers a little): adds max attempts and shared promises")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, print the markdown report, write results/rate.json."""
    args = parse_args(argv)
    if args.sweep:
        args.rates = SWEEP_RATES
    data = run(args)
    data["markdown"] = markdown_report(data)
    path = write_json("rate.json", data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory; worker logs in "
          f"{LOG_DIR.name}/)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
