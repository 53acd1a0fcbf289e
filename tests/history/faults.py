"""A seed's fault schedule, and the injector that carries it out and records each fault.

The schedule is a pure function of the seed and the length of the fault window: the same
seed gives the same faults, at the same times, with the same durations and target picks.
Kinds:

``kill_child``     SIGKILL a busy pool process (with the gevent pool, whose bodies run in
                   the worker's own process: its whole worker, restarted)
``kill_worker``    SIGKILL a whole worker, pool and all, and start it again under the same
                   node name (not in the window's last visibility timeout, so that its
                   unacknowledged messages come back before the run settles)
``stop_worker``    SIGSTOP a whole worker, SIGCONT it below half the shortest lease later
``store_restart``  ``kill -9`` the lock store and start it again: with its data (AOF) or
                   empty, by the run's persistence mode
``client_pause``   ``CLIENT PAUSE ... ALL`` on the lock store, below half the shortest lease
``stop_store``     SIGSTOP the lock store, SIGCONT it below half the shortest lease later

A worker's network to the lock store is not cut: that needs a network namespace of its
own (root, or user namespaces with a veth pair), which this check does not assume.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Callable, List, Tuple

import redis

from .events import Recorder
from .servers import Servers
from .workers import Workers
from .workload import SHORTEST_LEASE

KINDS = ("kill_child", "kill_worker", "stop_worker", "store_restart", "client_pause",
         "stop_store")

#: How often each kind comes in a bag of faults (drawn without replacement, refilled).
BAG = ("kill_child", "kill_child", "kill_child", "kill_worker", "stop_worker",
       "stop_worker", "store_restart", "client_pause", "stop_store")

#: Seconds between two faults, drawn from this range.
GAP = (2.5, 5.0)

#: Stops and pauses last below half the shortest lease (s).
LONGEST_STOP = SHORTEST_LEASE / 2 - 0.1


@dataclass(frozen=True)
class Fault:
    """One fault: ``at`` seconds after the start, of ``kind``, on target pick ``pick``,
    lasting ``duration`` seconds (stops and pauses)."""

    at: float
    kind: str
    pick: int
    duration: float


def schedule(seed: int, window: float, quiet_end: float) -> List[Fault]:
    """The faults of ``seed`` over ``window`` seconds; no whole worker is killed in the
    last ``quiet_end`` seconds (a pool process is, instead)."""
    rng = random.Random(f"faults-{seed}")
    faults: List[Fault] = []
    bag: List[str] = []
    at = rng.uniform(*GAP)
    while at < window:
        if not bag:
            bag = list(BAG)
            rng.shuffle(bag)
        kind = bag.pop()
        if kind == "kill_worker" and at > window - quiet_end:
            kind = "kill_child"
        faults.append(Fault(round(at, 3), kind, rng.randrange(1 << 30),
                            round(rng.uniform(0.3, LONGEST_STOP), 3)))
        at += rng.uniform(*GAP)
    return faults


class Injector:
    """Carries out faults on ``servers`` and ``workers``, recording each in ``record``.

    Stops end later: :meth:`tick` sends the SIGCONTs that are due, :meth:`finish` all of
    them at once.
    """

    def __init__(self, servers: Servers, workers: Workers, record: Recorder) -> None:
        self.servers = servers
        self.workers = workers
        self.record = record
        self._resumes: List[Tuple[float, Callable[[], None]]] = []

    def apply(self, fault: Fault) -> None:
        getattr(self, f"_{fault.kind}")(fault)

    def tick(self) -> None:
        now = time.monotonic()
        due = [resume for when, resume in self._resumes if when <= now]
        self._resumes = [(when, resume) for when, resume in self._resumes if when > now]
        for resume in due:
            resume()

    def finish(self) -> None:
        for _, resume in self._resumes:
            resume()
        self._resumes = []

    def _later(self, seconds: float, resume: Callable[[], None]) -> None:
        self._resumes.append((time.monotonic() + seconds, resume))

    def _kill_child(self, fault: Fault) -> None:
        mains = {self.workers.main_pid(name) for name in self.workers.names}
        busy = [(pid, worker) for _, pid, worker in self.record.running()
                if pid not in mains or self.workers.pool != "prefork"]
        if not busy:
            return
        pid, worker = busy[fault.pick % len(busy)]
        if self.workers.pool != "prefork":
            self._kill_whole(worker, "kill_child")
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.record.event("fault", fault="kill_child", pids=[pid], worker="",
                          data_lost=False)

    def _kill_worker(self, fault: Fault) -> None:
        names = self.workers.names
        self._kill_whole(names[fault.pick % len(names)], "kill_worker")

    def _kill_whole(self, name: str, kind: str) -> None:
        pids = self.workers.kill_whole(name)
        self.record.event("fault", fault=kind, pids=pids, worker=name, data_lost=False)
        self.workers.restart(name)

    def _stop_worker(self, fault: Fault) -> None:
        name = self.workers.names[fault.pick % len(self.workers.names)]
        if not self.workers.signal(name, signal.SIGSTOP):
            return
        self.record.event("fault", fault="stop_worker", pids=[], worker="",
                          stopped=name, duration=fault.duration, data_lost=False)

        def resume() -> None:
            self.workers.signal(name, signal.SIGCONT)
            self.record.event("resumed", worker=name)
        self._later(fault.duration, resume)

    def _store_restart(self, fault: Fault) -> None:
        self.servers.kill_and_restart_lock()
        self.record.event("fault", fault="store_restart", pids=[], worker="",
                          data_lost=not self.servers.keeps_data)

    def _client_pause(self, fault: Fault) -> None:
        milliseconds = int(fault.duration * 1000)
        try:
            self.servers.lock_client().execute_command("CLIENT", "PAUSE", milliseconds, "ALL")
        except redis.RedisError:
            return  # the store is down or stopped: this fault is another's moment
        self.record.event("fault", fault="client_pause", pids=[], worker="",
                          duration=fault.duration, data_lost=False)

    def _stop_store(self, fault: Fault) -> None:
        if self.servers.signal_lock(signal.SIGSTOP) is None:
            return
        self.record.event("fault", fault="stop_store", pids=[], worker="",
                          duration=fault.duration, data_lost=False)

        def resume() -> None:
            self.servers.signal_lock(signal.SIGCONT)
            self.record.event("resumed", worker="lock store")
        self._later(fault.duration, resume)
