"""The Celery app that the real worker processes of ``test_faults.py`` run.

Like :mod:`worker_app` (same :class:`~worker_app.AppUrls`, same environment variables),
but its task bodies record what a fault test needs in the record store:

``runs:<task id>``     how many times a body ran for that task id
``started``/``ended``  hash: task id -> Redis server time (µs) when the body started/ended
``pid``/``host``       hash: task id -> pool process id / worker node name of the body
``pids:<task id>``     list: the pool process id of each of its bodies, in order
``fence``/``lost``     hash: task id -> ``request.redislock_lease.fence`` and ``.lost``
                       (``"1"``/``"0"``), read when the body ends
``exited``             hash: task id -> the exception that ended a body early (SIGTERM
                       to a pool child raises ``SystemExit`` in it)
``running:<key>``      hash: task id -> ``"<pid>:<process start time>"`` of each body of
                       limit key ``<key>`` that started and has not ended
``peaks:<key>``        list: how many bodies of ``<key>`` were running as each started
``refused``            hash: task id -> how many times its admission was refused
``lease_lost``         hash: task id -> server time (µs) the ``lease_lost`` signal came
``failed``             hash: task id -> exception name, from ``task_failure`` (main
                       process of the worker)

A body ends however it ends, except when its process is SIGKILLed: then its entry stays
in ``running:<key>``. Each body,
once admitted, first drops the entries of processes that no longer run (a killed pool
child, a worker killed whole), then adds its own and counts them, in one step: a body
counted is one whose process was alive, inside its body, after the new one was admitted.
So a peak above the limit means two bodies really ran at once.

The workers route by node name (``worker_direct``): a test sends a task to one worker with
``queue=worker_direct(node)``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from celery import Celery
from celery.signals import task_failure

from celery_redislock import LimitedTask, SingletonTask
from celery_redislock.integration.signals import lease_lost, lock_contended

from worker_app import BROKER_URL_ENV, FAST_RETRY, AppUrls, Recorder

# Every deferral of a run, not only its first (INFO), is logged: the tests read every
# countdown from the workers' logs (assert_countdowns_short).
logging.getLogger("celery_redislock.line.waiting").setLevel(logging.DEBUG)

#: Names of the tasks, as both the workers and the test process register them.
HOLD = "fault_app.hold"
TIME_LIMITED = "fault_app.time_limited"
SLOW_REPORTED = "fault_app.slow_reported"
SHORT_LEASE = "fault_app.short_lease"
PAIR = "fault_app.pair"
ADOPTED = "fault_app.adopted"

#: Every task takes its limit key from its ``key`` argument: ``"<prefix><key>"``.
HOLD_PREFIX = "hold:"
SHORT_PREFIX = "short:"
PAIR_PREFIX = "pair:"
ADOPTED_PREFIX = "adopted:"

#: Leases: long enough that a slot coming back quickly cannot be the lease running out.
LONG_LEASE = 30.0
SHORT_LEASE_SECONDS = 1.0

#: ``pair``: two at a time per key, on a lease short enough for a test to wait one out.
PAIR_SLOTS = 2
PAIR_LEASE = 4.0

#: ``adopted``: one at a time per key, on a lease long enough that its pool process
#: adopts it without waiting for the answer (within a third of a lease of admission).
ADOPTED_LEASE = 6.0

#: The hard time limit of ``time_limited`` and ``slow_reported`` (seconds).
TIME_LIMIT = 1

#: How long the worker's main process spends reporting a failure of ``slow_reported``, as
#: an error reporter (a ``task_failure`` receiver) might.
SLOW_REPORT_SECONDS = 1.5

_RECORD_START = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
local id = ARGV[1]
redis.call('INCR', 'runs:' .. id)
redis.call('HSET', 'started', id, string.format('%.0f', micros))
redis.call('HSET', 'pid', id, ARGV[2])
redis.call('RPUSH', 'pids:' .. id, ARGV[2])
redis.call('HSET', 'host', id, ARGV[3])
for i = 5, #ARGV do
  local running = 'running:' .. ARGV[i]
  redis.call('HSET', running, id, ARGV[4])
  redis.call('RPUSH', 'peaks:' .. ARGV[i], redis.call('HLEN', running))
end
return micros
"""

_RECORD_END = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
local id = ARGV[1]
for i = 4, #ARGV do
  redis.call('HDEL', 'running:' .. ARGV[i], id)
end
redis.call('HSET', 'fence', id, ARGV[2])
redis.call('HSET', 'lost', id, ARGV[3])
redis.call('HSET', 'ended', id, string.format('%.0f', micros))
return micros
"""

_STAMP = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', micros))
return micros
"""


def process_identity(pid: int) -> Optional[str]:
    """``"<pid>:<start time>"`` of a live process, or None if it is gone or a zombie.

    The start time (clock ticks since boot, from ``/proc``) tells a reused pid apart.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
    if fields[0] in ("Z", "X", "x"):
        return None
    return f"{pid}:{fields[19]}"  # field 22: starttime


class FaultRecorder(Recorder):
    """Records fault-test bodies (see the module doc). One per process."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._fault_start = self.client.register_script(_RECORD_START)
        self._fault_end = self.client.register_script(_RECORD_END)
        self._stamp = self.client.register_script(_STAMP)

    def body_started(self, task_id: str, host: str, keys: Sequence[str]) -> int:
        """Drop dead holders' entries of ``keys``, then record this body's start."""
        for key in keys:
            running = self.client.hgetall(f"running:{key}")
            dead = [other for other, identity in running.items()
                    if process_identity(int(identity.split(b":")[0])) != identity.decode()]
            if dead:
                self.client.hdel(f"running:{key}", *dead)
        identity = process_identity(os.getpid())
        return int(self._fault_start(args=[task_id, os.getpid(), host, identity, *keys]))

    def body_ended(self, task_id: str, lease: Any, keys: Sequence[str]) -> int:
        fence = getattr(lease, "fence", "")
        lost = "1" if getattr(lease, "lost", False) else "0"
        return int(self._fault_end(args=[task_id, fence, lost, *keys]))

    def stamp(self, hash_name: str, field: str) -> int:
        """Set ``hash_name[field]`` to the server time (µs)."""
        return int(self._stamp(keys=[hash_name], args=[field]))

    def work(self, task: Any, keys: List[str], seconds: float,
             until: Optional[str] = None) -> str:
        """The body of every task here: record, work ``seconds``, record. With ``until``:
        work until the test pushes an entry to the list ``go:<until>`` instead (at most
        ``seconds``), so that the slot is held for as long as the test needs it, however
        slow a loaded machine makes the rest."""
        request = task.request
        self.body_started(request.id, request.hostname or "", keys)
        try:
            if until is None:
                time.sleep(seconds)  # the simulated work of the task body
            else:
                self._wait_for(f"go:{until}", seconds)
        except BaseException as exc:  # SystemExit: the pool child was sent SIGTERM
            self.client.hset("exited", request.id, type(exc).__name__)
            raise
        finally:
            self.body_ended(request.id, getattr(request, "redislock_lease", None), keys)
        return request.id


    def _wait_for(self, name: str, seconds: float) -> None:
        """Until list ``name`` has an entry (taken), at most ``seconds``; in steps of at
        most 5 s, under the client's socket timeout."""
        deadline = time.monotonic() + seconds
        left = seconds
        while left > 0 and not self.client.blpop(name, timeout=min(5.0, left)):
            left = deadline - time.monotonic()


_recorders: Dict[str, FaultRecorder] = {}
_recorders_guard = threading.Lock()


def fault_recorder(url: str) -> FaultRecorder:
    """The :class:`FaultRecorder` of ``url``, made once per process."""
    with _recorders_guard:
        if url not in _recorders:
            _recorders[url] = FaultRecorder(url)
        return _recorders[url]


def create_app(urls: AppUrls) -> Celery:
    """A Celery app on ``urls`` with the fault-test tasks registered (not shared)."""
    app = Celery("fault_app", broker=urls.broker, backend=urls.backend, set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_direct=True,
        # Countdowns must stay below half of it (checked by the tests).
        broker_transport_options={"visibility_timeout": 60},
    )

    def record() -> FaultRecorder:
        return fault_recorder(urls.record)

    @app.task(base=SingletonTask, bind=True, shared=False, name=HOLD,
              lock_key=HOLD_PREFIX + "{key}", lock_lease=LONG_LEASE, **FAST_RETRY)
    def hold(self: Any, seconds: float, key: str = "a") -> str:
        """One at a time per key, on a 30 s lease."""
        return record().work(self, [HOLD_PREFIX + key], seconds)

    @app.task(base=SingletonTask, bind=True, shared=False, name=TIME_LIMITED,
              lock_key=HOLD_PREFIX + "{key}", lock_lease=LONG_LEASE, time_limit=TIME_LIMIT,
              **FAST_RETRY)
    def time_limited(self: Any, seconds: float, key: str = "a") -> str:
        """Shares ``hold``'s slot; killed by its hard time limit when ``seconds`` > 1."""
        return record().work(self, [HOLD_PREFIX + key], seconds)

    @app.task(base=SingletonTask, bind=True, shared=False, name=SLOW_REPORTED,
              lock_key=HOLD_PREFIX + "{key}", lock_lease=LONG_LEASE, time_limit=TIME_LIMIT,
              **FAST_RETRY)
    def slow_reported(self: Any, seconds: float, key: str = "a") -> str:
        """``time_limited`` whose failures take the main process a while to report."""
        return record().work(self, [HOLD_PREFIX + key], seconds)

    @app.task(base=SingletonTask, bind=True, shared=False, name=SHORT_LEASE,
              lock_key=SHORT_PREFIX + "{key}", lock_lease=SHORT_LEASE_SECONDS, **FAST_RETRY)
    def short_lease(self: Any, seconds: float, key: str = "a") -> str:
        """One at a time per key, on a 1 s lease renewed every third of a second."""
        return record().work(self, [SHORT_PREFIX + key], seconds)

    @app.task(base=LimitedTask, bind=True, shared=False, name=PAIR, lock_slots=PAIR_SLOTS,
              lock_key=PAIR_PREFIX + "{key}", lock_lease=PAIR_LEASE, **FAST_RETRY)
    def pair(self: Any, seconds: float, key: str = "a") -> str:
        """Two at a time per key, on a 4 s lease renewed every 1.3 s."""
        return record().work(self, [PAIR_PREFIX + key], seconds)

    @app.task(base=SingletonTask, bind=True, shared=False, name=ADOPTED,
              lock_key=ADOPTED_PREFIX + "{key}", lock_lease=ADOPTED_LEASE, **FAST_RETRY)
    def adopted(self: Any, seconds: float, key: str = "a") -> str:
        """One at a time per key, on a 6 s lease: every admission takes the last slot, so
        the pool process adopts the lease (see ``Lease.adopt``)."""
        return record().work(self, [ADOPTED_PREFIX + key], seconds)

    def ours(sender: Any) -> bool:
        return getattr(sender, "app", None) is app

    def on_refused(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
        if ours(sender) and task_id:
            record().client.hincrby("refused", task_id, 1)

    def on_lease_lost(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
        if ours(sender) and task_id:
            record().stamp("lease_lost", task_id)

    def on_failure(sender: Any = None, task_id: Optional[str] = None, exception: Any = None,
                   **_: Any) -> None:
        if ours(sender) and task_id:
            record().client.hset("failed", task_id, type(exception).__name__)
            if sender.name == SLOW_REPORTED:
                time.sleep(SLOW_REPORT_SECONDS)  # a slow error reporter

    lock_contended.connect(on_refused, weak=False)
    lease_lost.connect(on_lease_lost, weak=False)
    task_failure.connect(on_failure, weak=False)
    return app


#: The app of the worker processes, which find the URLs in their environment. The test
#: process imports this module without those variables and calls :func:`create_app`.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
