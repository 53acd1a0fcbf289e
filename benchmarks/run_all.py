"""Run every benchmark, print one markdown summary and write the results file.

Run from the repository root::

    python -m benchmarks.run_all            # every benchmark, chart, benchmarks/RESULTS.md
    python -m benchmarks.run_all --quick    # shorter and noisier (about 3 minutes)

Each benchmark starts (and stops) its own private redis-servers; results are written to
``benchmarks/results/`` (semaphore.json, task_overhead.json, rate.json, contention.json,
scale.json, summary.json). The full run also draws ``docs/images/utilisation.png`` and
writes ``benchmarks/RESULTS.md``; the quick run writes ``results/RESULTS.quick.md`` and
leaves the chart alone (it has no long scenario to draw).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import (
    bench_contention,
    bench_rate,
    bench_scale,
    bench_semaphore,
    bench_task_overhead,
    chart_utilisation,
)
from .common import RESULTS_DIR, markdown_table, write_json

RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
QUICK_RESULTS_MD = RESULTS_DIR / "RESULTS.quick.md"
#: Everything from this line on in RESULTS.md is written by hand and kept by each run.
NOTES_MARKER = "<!-- notes below are written by hand; run_all keeps them -->"


def benchmark_arguments(quick: bool) -> Dict[str, List[str]]:
    """Command-line arguments of each benchmark."""
    if quick:
        return {
            "semaphore": ["--cycles", "2000", "--rounds", "3"],
            "task_overhead": ["--tasks", "1000", "--rounds", "3"],
            "rate": ["--rounds", "2", "--backlog-seconds", "2"],
            "contention": ["--scenarios", "short,overload", "--rounds", "1"],
            "scale": ["--samples", "300", "--ttl-wait", "0"],
        }
    return {"semaphore": [], "task_overhead": ["--rounds", "10", "--floors"], "rate": [],
            "contention": [], "scale": []}


def status(met: Optional[bool]) -> str:
    """A target's status cell."""
    return "not measured" if met is None else ("met" if met else "NOT met")


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
        status(rate["target_met"]),
    )


def contention_rows(contention: Dict[str, Any]) -> List[Sequence[str]]:
    """Summary rows of the contention benchmark: utilisation per target scenario, the
    limits, and the cost under overload."""
    rows: List[Sequence[str]] = []
    results = contention["results"]
    for name, target in contention["targets"].items():
        package, baseline = results[name]["package"], results[name]["baseline"]
        rows.append((
            f"Utilisation under contention, {package['label']}: package vs fixed-retry "
            "baseline",
            f"{package['utilisation']:.3f} vs {baseline['utilisation']:.3f}",
            f"{package['utilisation']:.3f}", f">= {target['target']}", status(target["met"]),
        ))
    worst = max(per_mode["package"]["worst_overtaking"] for per_mode in results.values())
    rows.append((
        "Under contention: at most N at once, each task run exactly once; package's worst "
        "overtaking", f"peak <= N and 1 run per task: "
        f"{'yes' if contention['limits_held'] else 'NO'}; overtaking {worst:g}",
        "", "always", status(contention["limits_held"]),
    ))
    if "overload" in results:
        package, baseline = results["overload"]["package"], results["overload"]["baseline"]
        rows.append((
            f"Lock-store commands per task under overload, {package['label']}",
            f"{package['lock_commands_per_task']:.1f} vs baseline "
            f"{baseline['lock_commands_per_task']:.1f}", "", "small", "reported",
        ))
    return rows


def scale_row(scale: Dict[str, Any]) -> Sequence[str]:
    """The summary row of the scale benchmark: keys left by idle semaphores."""
    idle = scale["idle"]
    if idle["waited"]:
        measured = (f"{idle['keys_left_at_release']:,} right after release, "
                    f"{idle['keys_left_after_wait']} after the TTL")
    else:
        measured = f"{idle['keys_left_at_release']:,} right after release (TTL not waited)"
    return (f"Keys left by {idle['keys_used']:,} idle semaphores", measured, "", "none after "
            "the TTL", status(scale["target_met"]))


def summary(reports: Dict[str, Dict[str, Any]]) -> str:
    """The combined markdown summary: targets first, then each benchmark's report."""
    semaphore, tasks = reports["semaphore"], reports["task_overhead"]
    sem = semaphore["results"]
    rows: List[Sequence[str]] = [
        (
            "Semaphore cycles/s vs redis-py Lock",
            f"{sem[bench_semaphore.SEMAPHORE]['cycles_per_second_median']:,.0f} vs "
            f"{sem[bench_semaphore.LOCK]['cycles_per_second_median']:,.0f}",
            f"{semaphore['ratio_semaphore_over_lock']:.3f}", ">= 1.0",
            status(semaphore["target_met"]),
        ),
        (
            "LimitedTask tasks/s vs plain task",
            f"{tasks['results']['limited']['tasks_per_second_median']:,.0f} vs "
            f"{tasks['results']['plain']['tasks_per_second_median']:,.0f}",
            f"{tasks['ratio_limited_over_plain']:.3f}", ">= 0.9", status(tasks["target_met"]),
        ),
        rate_row(reports["rate"]),
        *contention_rows(reports["contention"]),
        scale_row(reports["scale"]),
    ]
    table = markdown_table(("measure", "measured", "ratio", "target", "status"), rows)
    sections = "\n".join(reports[name]["markdown"] for name in
                         ("semaphore", "task_overhead", "rate", "contention", "scale"))
    return f"## Targets\n\n{table}\n\n{sections}"


def results_document(text: str, reports: Dict[str, Dict[str, Any]], quick: bool,
                     chart: Optional[Path]) -> str:
    """The whole RESULTS.md: when and where it was measured, how to reproduce, results."""
    env = reports["semaphore"]["environment"]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    chart_text = (
        "\n## Utilisation chart\n\n![Concurrency per key over time, package and baseline]"
        "(../docs/images/utilisation.png)\n" if chart is not None else ""
    )
    return (
        "# Benchmark results\n\n"
        f"Recorded {when} by `python -m benchmarks.run_all{' --quick' if quick else ''}` "
        f"at commit `{env.get('package_commit', '')[:10]}`, on {env['system']} "
        f"{env['machine']} with **{env['cpus']} CPUs**: Python {env['python']}, Redis "
        f"{env['redis_server']}, celery {env['celery']}, kombu {env['kombu']}, redis-py "
        f"{env['redis_py']}. Each benchmark compares its kinds side by side in one run "
        "against private redis-servers; read the ratios, not the absolute numbers, and "
        "expect noise when other work shares the machine.\n\n"
        f"{text}{chart_text}"
    )


def kept_notes(path: Path) -> str:
    """The hand-written part of a results file: from the :data:`NOTES_MARKER` line on."""
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    start = text.find(NOTES_MARKER)
    return "\n" + text[start:] if start >= 0 else ""


def main(argv: Optional[Sequence[str]] = None) -> str:
    """Run every benchmark, print the combined summary, write the results files."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter, noisier run")
    args = parser.parse_args(argv)
    arguments = benchmark_arguments(args.quick)
    reports = {
        "semaphore": bench_semaphore.main(arguments["semaphore"]),
        "task_overhead": bench_task_overhead.main(arguments["task_overhead"]),
        "rate": bench_rate.main(arguments["rate"]),
        "contention": bench_contention.main(arguments["contention"]),
        "scale": bench_scale.main(arguments["scale"]),
    }
    chart = None
    if not args.quick and importlib.util.find_spec("matplotlib") is not None:
        chart = chart_utilisation.main([])
    text = summary(reports)
    write_json("summary.json", {
        "semaphore_ratio": reports["semaphore"]["ratio_semaphore_over_lock"],
        "task_ratio": reports["task_overhead"]["ratio_limited_over_plain"],
        "rate_lowest_achieved_over_ideal": reports["rate"]["lowest_achieved_over_ideal"],
        "contention_targets": reports["contention"]["targets"],
        "contention_limits_held": reports["contention"]["limits_held"],
        "scale_idle": reports["scale"]["idle"],
        "targets_met": {name: report["target_met"] for name, report in reports.items()},
        "markdown": text,
    })
    document = results_document(text, reports, args.quick, chart)
    path = QUICK_RESULTS_MD if args.quick else RESULTS_MD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document + kept_notes(RESULTS_MD), encoding="utf-8")
    print("\n" + "=" * 72 + "\n")
    print(text)
    print(f"(written to {path})")
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
