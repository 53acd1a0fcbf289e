"""Where the worker's main process spends its time per task, one kind beside the plain
task: the peer comparison's worker (``bench_peers``), sampled with py-spy.

On the uncontended path the worker's main process sets the pace: it receives every
message, acknowledges it, hands it to the pool and reads its result back, one after
the other, while the pool processes wait for it. So a kind's throughput follows that
process's time per task, and this splits that time by what it was spent on, read from
its Python stacks:

* ``this package: waiting for the lock store``: the admission's round trip before the
  pool (the write and the blocking read of its reply);
* ``this package: its own Python``: the rest of the admission (the gate, the script's
  arguments, the reply's parsing);
* ``celery: hand the request to the pool``: Celery's own, for every kind (under the
  gate for this package's kinds, so counted apart from it);
* ``broker: acknowledge`` and ``broker: unacked bookkeeping``: kombu's Redis transport,
  a blocking round trip each per task (``QoS.ack``, ``QoS.append``);
* ``broker: receive a message``, ``pool: write the job``, ``pool: read the result``,
  ``idle`` (waiting in ``epoll`` for anything to do), and the rest.

Wall time, not CPU time: a blocking read counts while it waits, since the process does
nothing else meanwhile. Each kind runs in batches for ``--seconds`` while py-spy samples
the main process; a share of its samples times the elapsed time over the tasks run is
that share's time per task. Needs py-spy (``pip install py-spy``; the bench extra has it)
and the right to trace the worker (root, or ``ptrace_scope`` 0).

    python -m benchmarks.profile_main --kinds rate --mode ignored --seconds 8
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import bench_peers, fake_store
from .common import markdown_table

#: Categories, first match wins: (name, frames that mark it, the innermost frame must be
#: one of these, or anything when empty).
CATEGORIES: Tuple[Tuple[str, Tuple[str, ...], Tuple[str, ...]], ...] = (
    ("celery: hand the request to the pool",
     ("WorkController._process_task_sem", "WorkController._process_task"), ()),
    ("this package: waiting for the lock store", ("gate",),
     ("read_from_socket", "recv_into", "send_packed_command", "sendall")),
    ("this package: its own Python", ("gate",), ()),
    ("broker: acknowledge", ("QoS.ack",), ()),
    ("broker: unacked bookkeeping", ("QoS.append",), ()),
    ("broker: receive a message", ("Transport.on_readable", "MultiChannelPoller.on_readable",
                                   "Channel._brpop_read"), ()),
    ("pool: write the job", ("_write_job", "schedule_writes"), ()),
    ("pool: read the result", ("on_result_readable", "_recv_message"), ()),
    ("idle (epoll)", ("_epoll.poll",), ()),
)
OTHER = "the rest"
#: Every category's name, in the report's order.
NAMES = [*(name for name, _, _ in CATEGORIES), OTHER]


def frame_name(frame: str) -> str:
    """A py-spy raw frame (``function (file:line)``) without its place."""
    return frame.split(" (", 1)[0]


def _marked(name: str, mark: str) -> bool:
    """Whether the frame ``name`` is the function ``mark`` (or a function of that name
    nested in another: ``AsynPool._create_write_handlers.<locals>._write_job``)."""
    return name == mark or name.endswith("." + mark)


def category(stack: Sequence[str]) -> str:
    """The category of one sampled stack (outermost frame first)."""
    names = [frame_name(frame) for frame in stack]
    innermost = names[-1] if names else ""
    for name, marks, leaves in CATEGORIES:
        if any(_marked(frame, mark) for frame in names for mark in marks) and (
                not leaves or any(leaf in innermost for leaf in leaves)):
            return name
    return OTHER


def shares(raw_lines: Iterable[str]) -> Dict[str, float]:
    """The share of samples in each category, from py-spy's ``raw`` output."""
    counts: Dict[str, int] = collections.Counter()
    for line in raw_lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            counts[category(stack.split(";"))] += int(count)
    total = sum(counts.values()) or 1
    return {name: counts.get(name, 0) / total for name in NAMES}


def profile_kind(bench: bench_peers.Bench, kind: str, mode: str, seconds: float,
                 tasks: int, scratch: Path, py_spy: str) -> Tuple[Dict[str, float], float]:
    """Run ``kind`` in batches of ``tasks`` for ``seconds`` while py-spy samples the worker's
    main process: each category's wall time per task (µs), and the tasks per second."""
    bench_peers.run_batch(bench, kind, mode, tasks, -1)  # warm up
    assert bench.worker.process is not None
    out, log = scratch / f"{kind}-{mode}.txt", scratch / f"{kind}-{mode}.log"
    with log.open("w") as errors:
        spy = subprocess.Popen(
            [py_spy, "record", "--rate", "250", "--format", "raw", "--nonblocking",
             "--output", str(out), "--pid", str(bench.worker.process.pid)],
            stdout=subprocess.DEVNULL, stderr=errors)
    time.sleep(1.0)  # py-spy says nothing once it samples: give it time to attach
    started, done = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        bench_peers.run_batch(bench, kind, mode, tasks, 0)
        done += tasks
    elapsed = time.perf_counter() - started
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    if not out.exists():
        raise SystemExit(f"py-spy sampled nothing (exit {spy.returncode}; it needs root or "
                         f"kernel.yama.ptrace_scope 0): {log.read_text().strip()[-500:]}")
    per_task = elapsed * 1e6 / done
    with out.open() as raw:
        split = shares(raw)
    return {name: share * per_task for name, share in split.items()}, done / elapsed


def report(results: Dict[str, Tuple[Dict[str, float], float]], mode: str) -> str:
    """The table: each category's wall µs per task for every kind, plain first."""
    kinds = list(results)
    rows: List[Tuple[object, ...]] = []
    for name in NAMES:
        rows.append((name, *(f"{results[kind][0][name]:.0f}" for kind in kinds)))
    rows.append(("**all (wall µs/task)**",
                 *(f"**{sum(results[kind][0].values()):.0f}**" for kind in kinds)))
    rows.append(("tasks/s", *(f"{results[kind][1]:.0f}" for kind in kinds)))
    header = ("worker main process, µs/task", *(bench_peers.LABELS[k] for k in kinds))
    return (f"## The worker's main process per task, results {mode} (py-spy, wall time)\n\n"
            + markdown_table(header, rows))


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="slots,rate,once",
                        help="comma-separated kinds beside the plain task")
    parser.add_argument("--mode", default="ignored", choices=("ignored", "stored"))
    parser.add_argument("--seconds", type=float, default=8.0, help="sampled per kind")
    parser.add_argument("--tasks", type=int, default=300, help="tasks per batch")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    parser.add_argument("--fake-store", nargs="?", const="free", default="",
                        choices=sorted(fake_store.MODES),
                        help="this package's admissions granted without the lock store's "
                             "script ('ping': after one bare round trip), as in bench_peers")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise SystemExit("py-spy is needed: pip install py-spy")
    setup = argparse.Namespace(pool="prefork", concurrency=args.concurrency,
                               fake_store=args.fake_store, timeout=60.0)
    results: Dict[str, Tuple[Dict[str, float], float]] = {}
    with tempfile.TemporaryDirectory(prefix="redislock-profile-") as scratch, \
            bench_peers.started(setup) as bench:
        for kind in [bench.app.PLAIN, *[k for k in args.kinds.split(",") if k]]:
            results[kind] = profile_kind(bench, kind, args.mode, args.seconds, args.tasks,
                                         Path(scratch), py_spy)
    text = report(results, args.mode)
    print(text)
    return text


if __name__ == "__main__":
    main()
