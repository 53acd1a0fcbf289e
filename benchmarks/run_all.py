"""Run every benchmark and print one markdown summary.

Run from the repository root::

    python -m benchmarks.run_all            # defaults of every benchmark
    python -m benchmarks.run_all --quick    # fewer cycles, tasks and rounds

Each benchmark starts (and stops) its own private redis-server; results are written to
``benchmarks/results/`` (semaphore.json, task_overhead.json, rate.json, summary.json).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, Sequence

from . import bench_rate, bench_semaphore, bench_task_overhead
from .common import markdown_table, write_json


def benchmark_arguments(quick: bool) -> Dict[str, List[str]]:
    """Command-line arguments of each benchmark."""
    if quick:
        return {
            "semaphore": ["--cycles", "2000", "--rounds", "3"],
            "task_overhead": ["--tasks", "1000", "--rounds", "3"],
            "rate": ["--rounds", "2", "--backlog-seconds", "2"],
        }
    return {"semaphore": [], "task_overhead": [], "rate": []}


def rate_row(rate: Dict[str, Any]) -> Sequence[str]:
    """The summary row of the rate benchmark: its lowest achieved/ideal ratio, windows."""
    measured = "; ".join(
        f"{label}: {result['achieved_over_ideal_median']:.3f}, window "
        f"{result['worst_window']}/{result['allowed_per_window']}"
        for label, result in rate["results"].items()
    )
    return (
        "Rate limit: achieved/ideal rate, worst window/allowed", measured,
        f"{rate['lowest_achieved_over_ideal']:.3f}", ">= 0.95, no window over",
        "met" if rate["target_met"] else "NOT met",
    )


def summary(semaphore: Dict[str, Any], tasks: Dict[str, Any], rate: Dict[str, Any]) -> str:
    """The combined markdown summary: targets first, then each benchmark's report."""
    sem = semaphore["results"]
    rows = [
        (
            "Semaphore cycles/s vs redis-py Lock",
            f"{sem[bench_semaphore.SEMAPHORE]['cycles_per_second_median']:,.0f} vs "
            f"{sem[bench_semaphore.LOCK]['cycles_per_second_median']:,.0f}",
            f"{semaphore['ratio_semaphore_over_lock']:.3f}", ">= 1.0",
            "met" if semaphore["target_met"] else "NOT met",
        ),
        (
            "LimitedTask tasks/s vs plain task",
            f"{tasks['results']['limited']['tasks_per_second_median']:,.0f} vs "
            f"{tasks['results']['plain']['tasks_per_second_median']:,.0f}",
            f"{tasks['ratio_limited_over_plain']:.3f}", ">= 0.9",
            "met" if tasks["target_met"] else "NOT met",
        ),
        rate_row(rate),
    ]
    table = markdown_table(("measure", "measured", "ratio", "target", "status"), rows)
    return (
        f"# celery-redislock benchmarks\n\n{table}\n\n"
        f"{semaphore['markdown']}\n{tasks['markdown']}\n{rate['markdown']}"
    )


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Run every benchmark, print the combined summary, write results/summary.json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter, noisier run")
    args = parser.parse_args(argv)
    arguments = benchmark_arguments(args.quick)
    semaphore = bench_semaphore.main(arguments["semaphore"])
    tasks = bench_task_overhead.main(arguments["task_overhead"])
    rate = bench_rate.main(arguments["rate"])
    text = summary(semaphore, tasks, rate)
    write_json("summary.json", {
        "semaphore_ratio": semaphore["ratio_semaphore_over_lock"],
        "semaphore_target_met": semaphore["target_met"],
        "task_ratio": tasks["ratio_limited_over_plain"],
        "task_target_met": tasks["target_met"],
        "rate_lowest_achieved_over_ideal": rate["lowest_achieved_over_ideal"],
        "rate_windows_ok": rate["windows_ok"],
        "rate_target_met": rate["target_met"],
        "markdown": text,
    })
    print("\n" + "=" * 72 + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
