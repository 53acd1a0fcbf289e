"""The history check's short run under pytest (``pytest -m history -s``): real workers,
the seeded faults, the checker's verdict. Marked ``history``, outside the default run;
CI runs the same check as a step of its own (``python -m tests.history``)."""

from __future__ import annotations

import pytest

from history.run import Options, run
from history.table import render

pytestmark = pytest.mark.history


@pytest.mark.parametrize("persistence", ["aof", "none"])
def test_history_short(persistence: str) -> None:
    outcome = run(Options(seed=1, tasks=200, faults_for=60, persistence=persistence))
    print(render(f"seed 1, lock store {persistence}", outcome.verdict, outcome.facts))
    assert outcome.verdict.defects() == [], outcome.log_directory
