"""Measures of one contention batch, from its run records: pure functions, no Redis.

A record is one run of a task body: ``start`` and ``end`` (seconds, one clock) and
``first_ask`` (when the task id first reached a pool process), plus ``seq`` (send order)
and, when known, ``delivered`` (when the delivery that ran reached its pool process) and
``admitted`` (when its slot was taken).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

Record = Mapping[str, Any]


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of non-empty ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return float(ordered[rank - 1])


def utilisation(records: Sequence[Record], duration: float, slots: int) -> float:
    """Ideal makespan ``K·d/N`` over the actual one, first start to last end."""
    span = makespan(records)
    return len(records) * duration / slots / span if span > 0 else math.inf


def makespan(records: Sequence[Record]) -> float:
    """Seconds from the first start to the last end."""
    return max(r["end"] for r in records) - min(r["start"] for r in records)


def concurrency_steps(records: Sequence[Record]) -> List[Tuple[float, int]]:
    """``(time, bodies running from then on)`` at every start and end, in time order.

    At equal times ends come first, so a hand-off at the same instant is not counted as
    an overlap.
    """
    events = sorted(
        [(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
        key=lambda event: (event[0], event[1]),
    )
    running, steps = 0, []
    for moment, change in events:
        running += change
        steps.append((moment, running))
    return steps


def peak_concurrency(records: Sequence[Record]) -> int:
    """The most bodies running at once."""
    return max((running for _, running in concurrency_steps(records)), default=0)


def worst_overtaking(records: Sequence[Record], order_field: str = "first_ask") -> int:
    """The most tasks that asked later than one task (by ``order_field``) but started
    before it."""
    worst = 0
    for mine in records:
        overtook = sum(
            1 for other in records
            if other[order_field] > mine[order_field] and other["start"] < mine["start"]
        )
        worst = max(worst, overtook)
    return worst


def waits(records: Sequence[Record]) -> List[float]:
    """Seconds from each task's first ask to the start of its body."""
    return [r["start"] - r["first_ask"] for r in records]


def handoff_gaps(records: Sequence[Record], slots: int) -> List[float]:
    """Idle time of a slot between one body's end and the start that took its place.

    The (N+i)-th start can only happen once i bodies have ended, so it is paired with
    the i-th end: ``start[N+i] - end[i]`` is how long that freed slot stood empty while
    tasks were waiting for it (never negative while at most N run at once).
    """
    starts = sorted(r["start"] for r in records)
    ends = sorted(r["end"] for r in records)
    return [starts[slots + i] - ends[i] for i in range(len(records) - slots)]


def handoff_parts(records: Sequence[Record], slots: int) -> Dict[str, List[float]]:
    """Each hand-off gap (see :func:`handoff_gaps`) split in three, by the run that took
    the freed slot: end → its delivery reached a pool process, → its slot was taken,
    → its body started. Hand-offs whose run lacks the times are left out."""
    ends = sorted(r["end"] for r in records)
    starters = sorted(records, key=lambda r: r["start"])
    parts: Dict[str, List[float]] = {"to_delivery": [], "to_admission": [], "to_body": []}
    for index in range(len(records) - slots):
        run = starters[slots + index]
        if run.get("delivered") is None or run.get("admitted") is None:
            continue
        parts["to_delivery"].append(run["delivered"] - ends[index])
        parts["to_admission"].append(run["admitted"] - run["delivered"])
        parts["to_body"].append(run["start"] - run["admitted"])
    return parts


def ramp_up(records: Sequence[Record], slots: int) -> float:
    """Seconds from the first start to the N-th: how long the first slots took to fill."""
    starts = sorted(r["start"] for r in records)
    return starts[min(slots, len(starts)) - 1] - starts[0]


def batch_measures(records: Sequence[Record], duration: float, slots: int) -> Dict[str, Any]:
    """Every measure of one batch whose runs are ``records`` (one per task)."""
    gaps = handoff_gaps(records, slots)
    all_waits = waits(records)
    parts = handoff_parts(records, slots)
    split = {
        f"handoff_{name}_p50_s": percentile(values, 0.5) if values else None
        for name, values in parts.items()
    }
    return {
        **split,
        "utilisation": utilisation(records, duration, slots),
        "makespan_s": makespan(records),
        "ideal_makespan_s": len(records) * duration / slots,
        "peak_concurrency": peak_concurrency(records),
        "worst_overtaking": worst_overtaking(records, "first_ask"),
        "worst_overtaking_by_send_order": worst_overtaking(records, "seq"),
        "wait_p50_s": percentile(all_waits, 0.5),
        "wait_p99_s": percentile(all_waits, 0.99),
        "wait_max_s": max(all_waits),
        "handoff_gap_p50_s": percentile(gaps, 0.5) if gaps else 0.0,
        "handoff_gap_p90_s": percentile(gaps, 0.9) if gaps else 0.0,
        "handoff_gap_max_s": max(gaps) if gaps else 0.0,
        "handoff_gap_total_s": sum(gaps),
        "ramp_up_s": ramp_up(records, slots),
    }
