"""The three ``celery worker`` processes of a run: started, SIGKILLed whole and restarted
under the same node name, SIGSTOPped and SIGCONTinued, stopped."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from .app import GATE_ENV, LINE_ENV
from worker_app import AppUrls
from worker_cluster import TESTS_DIRECTORY, WorkerProcess

#: Each worker's pool processes (or greenlets).
CONCURRENCY = 3

#: The longest a whole worker's kill waits for its last process to be gone (s).
KILL_SETTLE = 5.0


def group_pids(pgid: int) -> List[int]:
    """Every live process of process group ``pgid`` (a worker and its pool processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):  # field 5: pgrp
            pids.append(int(entry.name))
    return sorted(pids)


def wait_gone(pgid: int, timeout: float = KILL_SETTLE) -> bool:
    """Wait until process group ``pgid`` has no live process left (a zombie has closed
    its files); False if one is still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while group_pids(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Workers:
    """``count`` workers ``worker1``... of ``history.app`` with pool ``pool``."""

    def __init__(self, urls: AppUrls, log_directory: Path, pool: str = "prefork",
                 count: int = 3, line: Optional[str] = None,
                 gate: Optional[str] = None) -> None:
        self.pool = pool
        env = dict(os.environ)
        env.update(urls.environment())
        env.pop(LINE_ENV, None)
        if line:
            env[LINE_ENV] = line
        env.pop(GATE_ENV, None)
        if gate:
            env[GATE_ENV] = gate
        paths = [str(TESTS_DIRECTORY), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("CELERY_CONFIG_MODULE", None)
        log_directory.mkdir(parents=True, exist_ok=True)
        self.processes: Dict[str, WorkerProcess] = {}
        for index in range(1, count + 1):
            name = f"worker{index}"
            command = [sys.executable, "-m", "celery", "-A", "history.app", "worker",
                       "-P", pool, "-c", str(CONCURRENCY), "-n", f"{name}@%h",
                       "--without-gossip", "--without-mingle", "--without-heartbeat",
                       "-l", "info"]
            self.processes[name] = WorkerProcess(name, command, env,
                                                 log_directory / f"{name}.log")

    @property
    def names(self) -> List[str]:
        return sorted(self.processes)

    def start(self, timeout: float = 60.0) -> None:
        """Start every worker and wait until each logs that it is ready."""
        offsets = {name: self.processes[name].log_size() for name in self.names}
        for name in self.names:
            self.processes[name].start()
        deadline = time.monotonic() + timeout
        for name in self.names:
            self.wait_ready(name, offsets[name], deadline)

    def wait_ready(self, name: str, offset: int, deadline: float) -> None:
        process = self.processes[name]
        while " ready." not in process.log_text(offset):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} did not start:\n{process.log_text(offset)}")
            time.sleep(0.05)

    def main_pid(self, name: str) -> Optional[int]:
        process = self.processes[name].process
        return None if process is None else process.pid

    def kill_whole(self, name: str) -> List[int]:
        """SIGKILL worker ``name`` and its pool processes; the pids that were killed.
        Returns once every one of them is gone: a pool process forked after the worker
        connected to the broker (one that replaced a killed one) holds the consumer's
        connection too, and the broker serves the dead worker's pending ``BRPOP`` (a
        message taken that no one receives) until the last holder has exited. The
        fault is recorded after this, and the checker's window for such a loss is
        measured from that record."""
        pid = self.main_pid(name)
        if pid is None:
            return []
        pids = group_pids(pid)
        self.processes[name].kill()
        wait_gone(pid)
        return pids

    def restart(self, name: str) -> int:
        """Start worker ``name`` again under its node name (not waiting for it to be
        ready); the log offset where its new life begins."""
        process = self.processes[name]
        process.reap_children()
        process.close_log()
        offset = process.log_size()
        process.start()
        return offset

    def signal(self, name: str, signum: int) -> bool:
        """Send ``signum`` to worker ``name``'s whole process group; False if gone."""
        pid = self.main_pid(name)
        if pid is None:
            return False
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def exited(self) -> List[str]:
        """The workers whose main process has exited (none should, unless killed)."""
        return [name for name in self.names if self.processes[name].returncode is not None]

    def stop(self) -> None:
        """SIGCONT then SIGKILL every worker, pool processes and all."""
        for name in self.names:
            self.signal(name, signal.SIGCONT)
            self.processes[name].kill()
            self.processes[name].close_log()

    def logs(self) -> str:
        return "\n".join(f"----- {name} -----\n{self.processes[name].log_text()}"
                         for name in self.names)
