"""Python calls per task in the worker's main process, one kind beside the plain task:
the peer comparison's worker (``bench_peers``), profiled with cProfile batch by batch.

Load-insensitive where throughput and CPU time are not: the count of Python calls (and
of the functions that make them) per run is the same on a quiet machine and a busy one,
so it tells whether a change cut the main process's own work while other work shares
the cores. The worker's main process profiles itself between two signals
(:data:`START`, :data:`STOP`; see :func:`install`, which ``peers_app`` calls when
:data:`ENV` names a directory) and writes each profile there; each kind runs
``--batches`` batches of ``--tasks`` under the profiler. The report gives each kind's
calls per task, over the plain task's, and the functions whose calls per task differ
most from the plain task's (the kind's own work, and what it spares Celery).

    python -m benchmarks.main_calls --kinds slots --mode ignored --tasks 1000
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import bench_peers
from .common import markdown_table

#: The worker's environment variable naming the directory of its main process's profiles.
ENV = "REDISLOCK_BENCH_MAIN_CALLS"
#: The signals that start and stop (and write) the main process's profile.
START, STOP = signal.SIGRTMIN + 1, signal.SIGRTMIN + 2
#: The profile's file in that directory.
PROFILE = "main.prof"

_profiler: Optional[cProfile.Profile] = None


#: The signals that start and stop (and write) the count of the package's own frames.
FRAMES_START, FRAMES_STOP = signal.SIGRTMIN + 3, signal.SIGRTMIN + 4
#: That count's file.
FRAMES = "frames.json"
#: Celery's own work that the package calls on (its strategy's handler, the consumer's
#: hand-over of a request to the pool, the request's start there, its acceptance and its
#: end handlers), which a plain task does as well: not counted.
CELERY_OWN = frozenset({"task_message_handler", "_process_task_sem", "_process_task",
                        "execute_using_pool", "on_success", "on_failure", "on_accepted"})


class FrameCount:
    """A profile function (``sys.setprofile``) counting the Python frames the package's
    code runs in this thread, each under the package's function that was entered from
    outside it (an *entry*: the gate's strategy wrapper, a run's end, a timer, a reply
    of the lock store; or from Celery's own work, as the gate is from Celery's strategy),
    whatever they call, Celery's own work (:data:`CELERY_OWN`) left out. Exact per
    path, but not per task: the timers' entries (the queue's, the spare lease's, the
    store's deadline) fire by the clock, so they count more per task in a process slowed
    down (by load, or by this count itself, a Python call per frame), and how many runs
    are handed a slot rather than asking the store follows the timing too (two runs of
    the same code at load 15 differed by 6 frames a task, by its entries' mix). Compare
    codes in alternate runs, entry by entry."""

    def __init__(self) -> None:
        self.counts: Dict[str, int] = collections.Counter()
        #: One per live frame: its entry (None: outside the package), and whether
        #: counting is paused in it (inside Celery's own work).
        self.stack: List[Tuple[Optional[str], bool]] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            entry, paused = self.stack[-1] if self.stack else (None, False)
            if (entry is None or paused) and "celery_redislock" in code.co_filename:
                entry, paused = f"{Path(code.co_filename).name}:{code.co_name}", False
                self.counts[entry] += 1
            elif entry is not None and not paused:
                paused = (code.co_name in CELERY_OWN
                          and "/celery/worker/" in code.co_filename)
                if not paused:
                    self.counts[entry] += 1
            self.stack.append((entry, paused))
        elif event == "return" and self.stack:
            self.stack.pop()


def install(directory: str) -> None:
    """In the worker's main process: profile between :data:`START` and :data:`STOP`,
    written to ``directory`` at the stop (the pool's children, forked later, inherit the
    handlers but are never sent the signals)."""

    def start(*_: Any) -> None:
        global _profiler
        _profiler = cProfile.Profile()
        _profiler.enable()

    def stop(*_: Any) -> None:
        profiler = _profiler
        if profiler is None:
            return
        profiler.disable()
        partial = Path(directory) / (PROFILE + ".part")
        profiler.dump_stats(str(partial))
        partial.rename(Path(directory) / PROFILE)

    counter: List[FrameCount] = []

    def count(*_: Any) -> None:
        counter[:] = [FrameCount()]
        sys.setprofile(counter[0])

    def counted(*_: Any) -> None:
        sys.setprofile(None)
        partial = Path(directory) / (FRAMES + ".part")
        partial.write_text(json.dumps(counter[0].counts if counter else {}))
        partial.rename(Path(directory) / FRAMES)

    signal.signal(START, start)
    signal.signal(STOP, stop)
    signal.signal(FRAMES_START, count)
    signal.signal(FRAMES_STOP, counted)


def signalled_batches(bench: bench_peers.Bench, kind: str, mode: str, tasks: int,
                      batches: int, signals: Tuple[int, int], out: Path) -> str:
    """Run ``batches`` batches of ``kind`` between the worker's main process's two
    ``signals`` (start, stop); the path of the file ``out``, once it wrote it."""
    assert bench.worker.process is not None
    pid = bench.worker.process.pid
    bench_peers.run_batch(bench, kind, mode, tasks, -1)  # warm up
    os.kill(pid, signals[0])
    time.sleep(0.2)  # the handler runs at the main process's next turn of its loop
    for index in range(batches):
        bench_peers.run_batch(bench, kind, mode, tasks, index)
    os.kill(pid, signals[1])
    deadline = time.monotonic() + 30
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{out.name} was not written: {bench.worker.log_tail()}")
        time.sleep(0.05)
    return str(out)


def profiled_batches(bench: bench_peers.Bench, kind: str, mode: str, tasks: int,
                     batches: int, directory: Path) -> pstats.Stats:
    """Run ``batches`` batches of ``kind`` under the main process's profiler."""
    out = Path(signalled_batches(bench, kind, mode, tasks, batches, (START, STOP),
                                 directory / PROFILE))
    stats = pstats.Stats(str(out))
    out.unlink()
    return stats


def counted_batches(bench: bench_peers.Bench, kind: str, mode: str, tasks: int,
                    batches: int, directory: Path) -> Dict[str, float]:
    """The package's frames per task under each entry (:class:`FrameCount`) over
    ``batches`` batches of ``kind``."""
    out = Path(signalled_batches(bench, kind, mode, tasks, batches,
                                 (FRAMES_START, FRAMES_STOP), directory / FRAMES))
    counts = json.loads(out.read_text())
    out.unlink()
    return {entry: count / (tasks * batches) for entry, count in counts.items()}


def frames_report(results: Dict[str, Dict[str, float]], mode: str) -> str:
    """Each kind's frames of the package per task, by entry."""
    entries = sorted({entry for counts in results.values() for entry in counts},
                     key=lambda e: -max(counts.get(e, 0.0) for counts in results.values()))
    rows = [(entry, *(f"{results[kind].get(entry, 0.0):.2f}" for kind in results))
            for entry in entries]
    rows.append(("**all**", *(f"**{sum(results[kind].values()):.1f}**" for kind in results)))
    return (f"## The package's Python frames per task in the worker's main process, results "
            f"{mode}, by entry (Celery's own work left out)\n\n"
            + markdown_table(("entry", *(bench_peers.LABELS.get(k, k) for k in results)),
                             rows))


def per_function(stats: pstats.Stats, runs: int) -> Dict[str, float]:
    """Calls per run of every function of ``stats``."""
    table: Dict[Tuple[str, int, str], Tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    calls: Dict[str, float] = {}
    for (filename, line, name), (_, total, *_rest) in table.items():
        where = f"{Path(filename).name}:{line}({name})" if line else name
        calls[where] = calls.get(where, 0.0) + total / runs
    return calls


def python_calls(calls: Dict[str, float]) -> float:
    """The calls of Python functions among ``calls`` (each a frame; the built-in
    functions' names, such as ``<built-in method len>``, start with ``<``)."""
    return sum(count for name, count in calls.items() if not name.startswith("<"))


def report(results: Dict[str, Dict[str, float]], plain: str, mode: str, top: int) -> str:
    """Each kind's calls per run, and its functions that differ most from plain's."""
    base = results[plain]
    rows: List[Tuple[Any, ...]] = []
    for kind, calls in results.items():
        total, frames = sum(calls.values()), python_calls(calls)
        rows.append((bench_peers.LABELS.get(kind, kind), f"{total:.1f}",
                     "" if kind == plain else f"{total - sum(base.values()):+.1f}",
                     f"{frames:.1f}",
                     "" if kind == plain else f"{frames - python_calls(base):+.1f}"))
    text = (f"## The worker's main process: Python calls per task, results {mode}\n\n"
            + markdown_table(("kind", "calls/task", "over plain", "of Python functions",
                              "over plain"), rows))
    for kind, calls in results.items():
        if kind == plain:
            continue
        diffs = sorted(((calls.get(f, 0.0) - base.get(f, 0.0), f)
                        for f in set(calls) | set(base)), key=lambda d: -abs(d[0]))
        text += (f"\n\n{bench_peers.LABELS.get(kind, kind)}: the {top} functions whose calls "
                 "per task differ most from plain's\n\n" + markdown_table(
                     ("function", "calls/task over plain"),
                     [(f, f"{d:+.2f}") for d, f in diffs[:top]]))
    return text


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="slots", help="comma-separated kinds beside plain")
    parser.add_argument("--mode", default="ignored", choices=("ignored", "stored"))
    parser.add_argument("--tasks", type=int, default=1000, help="tasks per batch")
    parser.add_argument("--batches", type=int, default=3, help="profiled batches per kind")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    parser.add_argument("--top", type=int, default=40, help="functions listed per kind")
    parser.add_argument("--save", default="", help="a directory to keep each kind's profile in")
    parser.add_argument("--frames", action="store_true",
                        help="count the package's own frames per task by entry instead "
                             "(exact, see FrameCount) of profiling every call")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = parse_args(argv)
    results: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="redislock-main-calls-") as scratch:
        os.environ[ENV] = scratch  # the worker's environment is made from this one's
        setup = argparse.Namespace(pool="prefork", concurrency=args.concurrency,
                                   fake_store="", timeout=60.0)
        try:
            with bench_peers.started(setup) as bench:
                kinds = [bench.app.PLAIN, *[k for k in args.kinds.split(",") if k]]
                for kind in kinds:
                    if args.frames:
                        results[kind] = counted_batches(bench, kind, args.mode, args.tasks,
                                                        args.batches, Path(scratch))
                        continue
                    stats = profiled_batches(bench, kind, args.mode, args.tasks,
                                             args.batches, Path(scratch))
                    results[kind] = per_function(stats, args.tasks * args.batches)
                    if args.save:
                        stats.dump_stats(str(Path(args.save) / f"{kind}-{args.mode}.prof"))
                plain = bench.app.PLAIN
        finally:
            os.environ.pop(ENV, None)
    text = (frames_report(results, args.mode) if args.frames
            else report(results, plain, args.mode, args.top))
    print(text)
    return text


if __name__ == "__main__":
    main()
