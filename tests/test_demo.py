"""The demo in ``example_project/`` runs end to end: workers, burst, live view, summary, chart.

It starts its own private redis-server and three ``celery worker`` processes, so it is
marked slow; it takes 10-20 s.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parent.parent
DEMO = REPOSITORY / "example_project" / "demo.py"


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    chart = tmp_path / "timeline.png"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROJ_")}
    completed = subprocess.run(
        [sys.executable, str(DEMO), "--chart", str(chart)],
        cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=120,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "every limit held: yes" in output
    assert "every task ran exactly once: yes (66 of 66)" in output
    # Not a terminal: the live view prints one plain line a second, no cursor movement.
    assert "\x1b[" not in completed.stdout
    assert " proj.tasks.crawl " in completed.stdout and " d16" in completed.stdout
    for key in ("proj.tasks.crawl", "customer:4", "proj.tasks.rebuild_index", "partner:acme"):
        assert any(line.startswith(key) and line.rstrip().endswith("OK")
                   for line in completed.stdout.splitlines()), (key, output)
    if importlib.util.find_spec("matplotlib") is not None:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "no chart" in output
