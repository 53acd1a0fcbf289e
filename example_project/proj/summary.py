"""What the burst did, from the tasks' records: per limit key, the peak against the limit,
the runs completed, the waits, and whether every task ran exactly once.

Two independent measures of "how many runs of a key were inside their bodies at once":
the peak of a counter the runs ``INCR`` at their start and ``DECR`` at their end, and the
most recorded start-end intervals that overlap. A rate limit is checked on the times the
lock store admitted the runs: never more than ``count + burst`` in any window of its period.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from proj.burst import Limit, Sent
from proj.records import Recorder, Run


def peak_overlap(intervals: Sequence[Tuple[int, int]]) -> int:
    """The most ``(start, end)`` intervals open at one moment (an end before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, change in events:
        open_now += change
        peak = max(peak, open_now)
    return peak


def most_in_window(times: Sequence[int], window: int) -> int:
    """The most of ``times`` inside any half-open window ``[t, t + window)``."""
    ordered = sorted(times)
    most = first = 0
    for last, time in enumerate(ordered):
        while ordered[first] <= time - window:
            first += 1
        most = max(most, last - first + 1)
    return most


@dataclass(frozen=True)
class KeyReport:
    """What happened under one limit key."""

    limit: Limit
    runs: List[Run]
    peak_counter: int

    @property
    def completed(self) -> int:
        """Runs of the key that reached the end of their body."""
        return sum(run.end_us is not None for run in self.runs)

    @property
    def sent_back(self) -> int:
        """How many times, in all, a run found the key full and parked (or a copy of an
        already served run ended unrun): its deliveries that did not run the body."""
        return sum(run.waits for run in self.runs)

    @property
    def peak_timeline(self) -> int:
        """The most runs whose recorded start-end intervals overlap."""
        return peak_overlap([(run.start_us, run.end_us) for run in self.runs
                             if run.end_us is not None])

    @property
    def peak(self) -> int:
        """The higher of the two measures of runs at once."""
        return max(self.peak_counter, self.peak_timeline)

    @property
    def most_starts(self) -> int:
        """The most admissions in any window of the rate's period (0 without a rate)."""
        if self.limit.rate is None:
            return 0
        admitted = [run.admitted_ms for run in self.runs if run.admitted_ms is not None]
        return most_in_window(admitted, round(self.limit.rate.period * 1000))

    @property
    def waits(self) -> List[float]:
        """Seconds from each run's first ask for a slot to the start of its body."""
        return [run.wait_s for run in self.runs if run.wait_s is not None]

    @property
    def ok(self) -> bool:
        """True if no measure saw the limit exceeded."""
        slots_ok = self.limit.slots is None or self.peak <= self.limit.slots
        rate_ok = self.limit.most_starts is None or self.most_starts <= self.limit.most_starts
        return slots_ok and rate_ok


@dataclass(frozen=True)
class Report:
    """The demo's findings."""

    keys: List[KeyReport]
    tasks: int
    problems: List[str]
    sent_at_us: int  # when the burst was sent, on the record store's clock

    @property
    def limits_held(self) -> bool:
        """True if every limit key stayed within its limit."""
        return all(key.ok for key in self.keys)

    @property
    def ran_exactly_once(self) -> bool:
        """True if every task sent ran once, to completion, and succeeded."""
        return not self.problems


def run_problem(task: Sent, starts: int, run: Optional[Run]) -> Optional[str]:
    """Why ``task`` did not run exactly once and succeed, or None if it did."""
    state = task.result.state
    if starts == 1 and run is not None and run.end_us is not None and state == "SUCCESS":
        return None
    return f"{task.call} [{task.result.id}]: started {starts} time(s), state {state}"


def analyse(sent: Sequence[Sent], limits: Sequence[Limit], records: Recorder,
            sent_at_us: int) -> Report:
    """Compare what was sent with what the tasks recorded."""
    starts = records.starts()
    runs = {task.result.id: records.run(task.result.id) for task in sent}
    problems = [problem for task in sent
                if (problem := run_problem(task, starts.get(task.result.id, 0),
                                           runs[task.result.id]))]
    problems += [f"unexpected run of task id {task_id}" for task_id in set(starts) - set(runs)]
    by_key: Dict[str, List[Run]] = {limit.name: [] for limit in limits}
    for run in runs.values():
        if run is not None:
            by_key.setdefault(run.limit_key, []).append(run)
    keys = [KeyReport(limit, by_key[limit.name], max(records.levels(limit.name), default=0))
            for limit in limits]
    return Report(keys=keys, tasks=len(sent), problems=problems, sent_at_us=sent_at_us)


def _seconds(values: Sequence[float], pick: str) -> str:
    if not values:
        return "-"
    value = statistics.median(values) if pick == "p50" else max(values)
    return f"{value:.1f} s"


def _peak(key: KeyReport) -> str:
    if key.limit.slots is not None:
        return f"{key.peak}/{key.limit.slots}"
    return f"{key.most_starts}/{key.limit.most_starts}"


def print_report(report: Report) -> None:
    """Print the summary table and the two verdicts."""
    header = (f"{'limit key':<26} {'limit':>7} {'peak':>6} {'done':>7} {'parked':>9} "
              f"{'wait p50':>8} {'wait max':>8}  verdict")
    print()
    print(header)
    print("-" * len(header))
    for key in report.keys:
        print(f"{key.limit.name:<26} {key.limit.label:>7} {_peak(key):>6} "
              f"{key.completed:>3}/{key.limit.sent:<3} {key.sent_back:>9} "
              f"{_seconds(key.waits, 'p50'):>8} {_seconds(key.waits, 'max'):>8}  "
              f"{'OK' if key.ok else 'EXCEEDED'}")
    print("-" * len(header))
    print("peak: the most runs inside their bodies at once (a rate: the most starts in one "
          "period) / the most allowed")
    print(f"every limit held: {'yes' if report.limits_held else 'NO'}")
    done = report.tasks - len(report.problems)
    print(f"every task ran exactly once: {'yes' if report.ran_exactly_once else 'no'} "
          f"({done} of {report.tasks})")
    for problem in report.problems:
        print(f"  - {problem}")
