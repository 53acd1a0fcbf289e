"""``python -m tests.history``: run the history check for some seeds and persistence modes,
print one table per run (and a summary line per run when there are several), exit 1 when
any run found a defect.

    .venv/bin/python -m tests.history --seed 3 --tasks 300 --faults-for 90 --persistence aof
    .venv/bin/python -m tests.history --seeds 1-10 --tasks 1500 --faults-for 300 \\
        --persistence both
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from celery_redislock.config.settings import DEFAULT_LINE, GATES, LINES

from .checker import Verdict
from .run import Options, Outcome, run
from .table import render


def seeds(text: str) -> List[int]:
    """``"3"`` -> [3]; ``"1-4"`` -> [1, 2, 3, 4]; ``"1,5"`` -> [1, 5]."""
    found: List[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        found += range(int(first), int(last or first) + 1)
    return found


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="python -m tests.history", description=__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parse.add_argument("--seed", "--seeds", dest="seeds", type=seeds, default=[1],
                       help="a seed, a range 1-10, or a list 1,5 (default 1)")
    parse.add_argument("--tasks", type=int, default=300, help="tasks per run (default 300)")
    parse.add_argument("--faults-for", type=float, default=90.0,
                       help="seconds of faults, while the tasks are sent (default 90)")
    parse.add_argument("--persistence", choices=("aof", "none", "both"), default="aof",
                       help="the lock store keeps its data (aof), or not (none)")
    parse.add_argument("--pool", choices=("prefork", "gevent"), default="prefork")
    parse.add_argument("--line", choices=(*LINES, "both"), default=DEFAULT_LINE,
                       help="the workers' redislock_line: where a refused run waits "
                            f"(default: the package's, {DEFAULT_LINE!r})")
    parse.add_argument("--gate", choices=GATES, default=None,
                       help="the workers' redislock_gate: how the main process asks the "
                            "lock store (default: the package's)")
    parse.add_argument("--log-dir", type=Path, default=None,
                       help="keep the workers' logs here (else kept only on a defect)")
    return parse


def summary(outcome: Outcome) -> str:
    """One markdown row: seed, mode, pool, tasks, faults, violations, lost, repeats."""
    verdict: Verdict = outcome.verdict
    facts = outcome.facts
    faults = sum(verdict.faults.values())
    violations: object = sum(p.over for p in verdict.peaks) + sum(r.over for r in verdict.rates)
    known = sum(p.over and verdict.over_known(p.key) for p in verdict.peaks)
    if known:
        violations = f"{violations} ({known} known: lease expired unrenewed)"
    cells = [facts["seed"], facts["persistence"], facts["line"], facts["pool"], verdict.tasks,
             faults,
             violations, len(verdict.lost),
             f"{len(verdict.repeated_explained)}/{len(verdict.repeated_known)}/"
             f"{len(verdict.repeated_unexplained)}",
             "PASS" if not verdict.defects() else f"{len(verdict.defects())} defects",
             facts["wall time (s)"]]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    modes = ("aof", "none") if args.persistence == "both" else (args.persistence,)
    lines = LINES if args.line == "both" else (args.line,)
    runs = [(seed, mode, line) for seed in args.seeds for mode in modes for line in lines]
    outcomes = []
    for seed, mode, line in runs:
        name = f"seed{seed}-{mode}" + ("" if line == DEFAULT_LINE else f"-{line}")
        log_dir = args.log_dir / name if args.log_dir else None
        outcome = run(Options(seed=seed, tasks=args.tasks, faults_for=args.faults_for,
                              persistence=mode, pool=args.pool, log_directory=log_dir,
                              line=line, gate=args.gate))
        title = (f"history check: seed {seed}, lock store {mode}, {line} line, "
                 f"{outcome.facts['gate']} gate, {args.pool}")
        print(render(title, outcome.verdict, outcome.facts), flush=True)
        if outcome.log_directory:
            print(f"  workers' logs: {outcome.log_directory}", flush=True)
        outcomes.append(outcome)
    if len(outcomes) > 1:
        print("| seed | lock store | line | pool | tasks | faults | violations | lost "
              "| repeated explained/known/unexplained | verdict | wall s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(summary(outcome) for outcome in outcomes))
    return 1 if any(outcome.verdict.defects() for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
