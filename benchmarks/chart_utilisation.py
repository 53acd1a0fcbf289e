"""The utilisation chart: bodies running at once on one key over time, against the limit.

Reads the contention benchmark's results (``benchmarks/results/contention.json``, written
by ``bench_contention.py``) and draws, for each of its short and long scenarios, the
package (``LimitedTask``) beside the fixed-countdown baseline: a step plot of how many
task bodies ran at once, the limit N as a line, and where the ideal makespan K·d/N would
have ended. Of each scenario and mode it draws the batch of median utilisation.

Run from the repository root (needs matplotlib, in the ``bench`` extra)::

    python -m benchmarks.chart_utilisation            # -> docs/images/utilisation.png
    python -m benchmarks.chart_utilisation --input other.json --output chart.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .common import RESULTS_DIR
from .contention_metrics import concurrency_steps

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INPUT = RESULTS_DIR / "contention.json"
DEFAULT_OUTPUT = REPO_ROOT / "docs" / "images" / "utilisation.png"
SCENARIOS = ("short", "long")
MODES = {"package": "celery-redislock LimitedTask", "baseline": "fixed 1 s retry baseline"}
COLOURS = {"package": "#1f77b4", "baseline": "#d62728"}


def median_batch(batches: List[Dict[str, Any]], scenario: str,
                 mode: str) -> Optional[Dict[str, Any]]:
    """The batch of ``scenario`` and ``mode`` whose utilisation is the median (lower)."""
    mine = sorted((b for b in batches if b["scenario"] == scenario and b["mode"] == mode),
                  key=lambda batch: batch["utilisation"])
    return mine[(len(mine) - 1) // 2] if mine else None


def draw(data: Dict[str, Any], output: Path) -> Path:
    """Draw the chart of ``data`` (the contention report) into ``output``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [s for s in SCENARIOS if any(b["scenario"] == s for b in data["batches"])]
    if not scenarios:
        raise SystemExit("the results hold no short or long scenario to draw")
    figure, axes = plt.subplots(len(scenarios), len(MODES), figsize=(11, 3.1 * len(scenarios)),
                                squeeze=False, sharey=True)
    for row, scenario in enumerate(scenarios):
        spans = [b["makespan_s"] for b in data["batches"] if b["scenario"] == scenario]
        for column, mode in enumerate(MODES):
            axis = axes[row][column]
            batch = median_batch(data["batches"], scenario, mode)
            if batch is None:
                axis.set_visible(False)
                continue
            plot_batch(axis, batch, COLOURS[mode])
            axis.set_xlim(0, max(spans) * 1.05)
            axis.set_title(
                f"{MODES[mode]}: {scenario}, d={batch['duration']:g} s, K={batch['tasks']}\n"
                f"utilisation {batch['utilisation']:.2f}, makespan {batch['makespan_s']:.1f} s "
                f"(ideal {batch['ideal_makespan_s']:.1f} s)", fontsize=9,
            )
            if row == len(scenarios) - 1:
                axis.set_xlabel("seconds since the first start")
            if column == 0:
                axis.set_ylabel("bodies running on the key")
    slots = data["slots"]
    axes[0][0].set_ylim(0, slots + 1)
    axes[0][0].set_yticks(range(slots + 2))
    figure.suptitle(
        f"Concurrency per key under a backlog: N={slots} slots, "
        f"{data['workers']} workers x {data['concurrency']} processes", fontsize=11,
    )
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return output


def plot_batch(axis: Any, batch: Dict[str, Any], colour: str) -> None:
    """One panel: the step plot of one batch, the limit, and the ideal end."""
    records = batch["records"]
    origin = min(record["start"] for record in records)
    steps = concurrency_steps(records)
    times = [0.0] + [moment - origin for moment, _ in steps]
    running = [0] + [count for _, count in steps]
    # The fill shows the slot time used; drawn without edges or antialiasing, so the
    # many millisecond-long hand-off dips do not grey it out at this scale.
    axis.fill_between(times, running, step="post", color=colour, alpha=0.25, linewidth=0,
                      antialiased=False)
    axis.step(times, running, where="post", color=colour, linewidth=0.6)
    axis.axhline(batch["slots"], color="black", linestyle="--", linewidth=1,
                 label=f"limit N={batch['slots']}")
    axis.axvline(batch["ideal_makespan_s"], color="grey", linestyle=":", linewidth=1,
                 label="ideal end K·d/N")
    axis.legend(loc="upper right", fontsize=7)
    axis.grid(alpha=0.3)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT,
                        help="the contention benchmark's JSON")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the PNG to write")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Path:
    """Draw the chart from the contention results; return the PNG's path."""
    args = parse_args(argv)
    data = json.loads(args.input.read_text(encoding="utf-8"))
    path = draw(data, args.output)
    print(f"chart written to {path}")
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
