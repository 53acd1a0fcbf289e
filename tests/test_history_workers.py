"""The history check's whole-worker kill (tests/history/workers.py): it returns only
once every process of the worker's group is gone, a pool process that outlives its
main process included (it may hold the worker's broker connection)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from history.workers import group_pids, wait_gone

#: A main process that forks a child, both in a process group of their own, then sleep.
FORKING = "import os, time; os.fork(); time.sleep(60)"


def test_wait_gone_returns_once_the_whole_group_has_exited() -> None:
    main = subprocess.Popen([sys.executable, "-c", FORKING], start_new_session=True)
    try:
        assert wait_until_two(main.pid), "the main process and its child"
        os.killpg(main.pid, signal.SIGKILL)
        main.wait()  # the main process reaped; its child may not have exited yet
        assert wait_gone(main.pid, timeout=10.0)
        assert group_pids(main.pid) == []
    finally:
        if main.poll() is None:
            os.killpg(main.pid, signal.SIGKILL)
            main.wait()


def test_wait_gone_gives_up_on_a_live_group() -> None:
    main = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        assert not wait_gone(main.pid, timeout=0.05)
    finally:
        main.kill()
        main.wait()


def wait_until_two(pgid: int) -> bool:
    """True once group ``pgid`` has two live processes (within 10 s)."""
    deadline = time.monotonic() + 10.0
    while len(group_pids(pgid)) < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
