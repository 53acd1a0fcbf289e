"""The demo in ``example_project/``: its live view and summary parts, and a run end to end
(workers, burst, live view, summary, chart).

The end-to-end run starts its own private redis-server and three ``celery worker``
processes, so it is marked slow; it takes 10-20 s.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
DEMO = REPOSITORY / "example_project" / "demo.py"
sys.path.insert(0, str(DEMO.parent))

from proj.burst import Limit  # noqa: E402
from proj.live import (  # noqa: E402
    PLAIN_LEGEND,
    LiveView,
    Row,
    SlotState,
    bar,
    parked_counts_key,
    read_semaphores,
)
from proj.summary import most_in_window, peak_overlap  # noqa: E402

from celery_redislock.engine.keys import semaphore_key  # noqa: E402


def test_peak_overlap_counts_an_end_before_a_start_at_a_tie() -> None:
    assert peak_overlap([(0, 10), (10, 20), (5, 15)]) == 2
    assert peak_overlap([]) == 0


def test_most_in_window_is_half_open() -> None:
    assert most_in_window([0, 250, 500, 750, 1000], 1000) == 4
    assert most_in_window([0, 0, 250, 999], 1000) == 4
    assert most_in_window([], 1000) == 0


def test_read_semaphores_counts_live_holders_and_reservations(redis_client) -> None:
    key = semaphore_key("customer:1")
    seconds, micros = redis_client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    redis_client.zadd(key, {
        "t1 1 1 holder": now_ms + 30_000,   # a live holder
        "~~7": now_ms + 10_000,             # a slot reserved for a run moved out of parking
        "t0 1 1 gone": now_ms - 1_000,      # a lease that ran out
        "#fence": -123,                     # statistics, never a holder
    })
    redis_client.hset(parked_counts_key(key), mapping={"w": 2, "a": 1})
    assert parked_counts_key(key) == key.replace("}:s:", "}:pn:")
    assert read_semaphores(redis_client, [key]) == {key: SlotState(1, 1, 3)}


def test_bar_shows_held_then_handed_over_then_free() -> None:
    limit = Limit("k", 3, None, "s", sent=5)
    row = Row(limit, used=2, handed_over=1, capacity=3, waiting=0, in_line=None, done=0)
    assert bar(row, 0) == "██ ▒▒ ··"


def test_plain_view_says_once_what_its_letters_mean() -> None:
    """Off a terminal, the line before the first ``w14 l14 d0`` says what it holds."""
    import io

    out = io.StringIO()
    limit = Limit("proj.tasks.crawl", 2, None, "s", sent=14)
    view = LiveView(records=None, lock_client=None, limits=[limit], out=out, tty=False)
    view.saw_waiting_line = True
    row = Row(limit, used=2, handed_over=0, capacity=2, waiting=14, in_line=14, done=0)
    view.draw(1.0, [row])
    view.draw(2.0, [row])
    lines = out.getvalue().splitlines()
    assert lines[0] == PLAIN_LEGEND and len(lines) == 3
    assert "w = sent, not started yet" in lines[0] and "d = done" in lines[0]
    assert "l = in its parked line" in lines[0]
    assert lines[1].endswith("proj.tasks.crawl 2/2 w14 l14 d0")


@pytest.mark.slow

def test_demo_runs_end_to_end(own_redis_server) -> None:
    committed = REPOSITORY / "docs" / "images" / "demo_timeline.png"
    before = committed.read_bytes()
    chart = REPOSITORY / "example_project" / "output" / "demo_timeline.png"
    chart.unlink(missing_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROJ_")}
    completed = subprocess.run(
        [sys.executable, str(DEMO), "--redis-url", own_redis_server.url],
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
    assert committed.read_bytes() == before  # the committed chart is not rewritten
    # On a Redis of the user's own the demo leaves no key behind that never expires,
    # beyond the broker's own: its bookkeeping, and its queue ("celery"), where the
    # stopping workers put back the messages they had not acknowledged.
    client = own_redis_server.client()
    lasting = [key.decode() for key in client.scan_iter(count=1000) if client.ttl(key) == -1]
    broker = ("_kombu.", "unacked", "celery")
    assert [key for key in lasting if not key.startswith(broker)] == []
