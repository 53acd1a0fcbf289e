"""The Celery app of the contention benchmark, loaded both by the workers and the sender.

Every URL comes from the environment, so the benchmark can point it at its private
redis-servers:

``REDISLOCK_BENCH_BROKER_URL``   broker
``REDISLOCK_BENCH_BACKEND_URL``  result backend
``REDISLOCK_BENCH_LOCK_URL``     lock store (``redislock_url``): only the limits live there,
                                 so its command counts are the limits' cost alone
``REDISLOCK_BENCH_RECORD_URL``   where runs are recorded (a database of the broker's server)
``REDISLOCK_BENCH_SLOTS``        N, the slots of both tasks' semaphores (default 2)
``REDISLOCK_BENCH_RETRY_COUNTDOWN`` the baseline's fixed retry countdown, s (default 1)

Two tasks take ``(run, seq, duration)`` and sleep ``duration`` seconds inside a slot of
the semaphore ``run:<run>`` (a fresh key per batch):

* ``bench.contention.limited``: ``LimitedTask`` with ``lock_slots=N`` and every other
  option at its default: a run that finds no free slot is handled by the package;
* ``bench.contention.baseline``: a plain task that takes the package's ``Semaphore``
  without blocking and otherwise calls ``self.retry(countdown=FIXED)``; the task has
  ``max_retries=None``, so it retries until it gets a slot.

A ``task_prerun`` handler stores, with ``SET NX``, the time each task id first reached a
pool process, and a ``lock_contended`` handler the time a limited run was first refused
before it (the worker's main process asks first): its first ask. Each body that runs
appends one JSON record (task id, ``seq``, start, end, worker, pid, when the delivery
that ran reached its pool process, and the Redis server time at which its slot was
taken) to ``bench:contention:<run>``.
Times are ``time.time()`` of processes, and the Redis server's clock, on one machine.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Optional

import redis
from celery import Celery, Task
from celery.signals import task_prerun

from celery_redislock import LimitedTask, Semaphore
from celery_redislock.integration.signals import lock_contended

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
BACKEND_ENV = "REDISLOCK_BENCH_BACKEND_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
RECORD_ENV = "REDISLOCK_BENCH_RECORD_URL"
SLOTS_ENV = "REDISLOCK_BENCH_SLOTS"
COUNTDOWN_ENV = "REDISLOCK_BENCH_RETRY_COUNTDOWN"

QUEUE = "redislock-bench-contention"
LIMITED = "bench.contention.limited"
BASELINE = "bench.contention.baseline"
WARMUP = "bench.contention.warmup"
TASKS = (LIMITED, BASELINE, WARMUP)


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set")
    return value


SLOTS = int(os.environ.get(SLOTS_ENV, "2"))
RETRY_COUNTDOWN = float(os.environ.get(COUNTDOWN_ENV, "1"))


def records_key(run: str) -> str:
    """The list of batch ``run``'s run records."""
    return f"bench:contention:{run}"


def first_ask_key(task_id: str) -> str:
    """Where the time task ``task_id`` first reached a pool process is kept."""
    return f"bench:first:{task_id}"


app = Celery(
    "redislock_bench_contention",
    broker=_required_env(BROKER_ENV),
    backend=_required_env(BACKEND_ENV),
)
app.conf.update(
    redislock_url=_required_env(LOCK_ENV),
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_clients: dict = {}


def _client(env: str) -> redis.Redis:
    """This process's client of the URL in ``env``, made on first use (after any fork)."""
    key = (env, os.getpid())
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(_required_env(env))
    return client


#: When the delivery now running in this process reached it (``task_prerun``).
_delivered = {"task_id": None, "at": 0.0}


def _record(task: Task, run: str, seq: int, start: float, end: float,
            admitted_ms: Optional[int] = None) -> None:
    request = task.request
    delivered = _delivered["at"] if _delivered["task_id"] == request.id else None
    record = {
        "task_id": request.id, "seq": seq, "start": start, "end": end,
        "worker": request.hostname or socket.gethostname(), "pid": os.getpid(),
        "delivered": delivered,
        "admitted": admitted_ms / 1000.0 if admitted_ms is not None else None,
    }
    _client(RECORD_ENV).rpush(records_key(run), json.dumps(record))


@task_prerun.connect
def note_first_ask(task_id: Optional[str] = None, task: Optional[Task] = None,
                   **_: Any) -> None:
    """Keep the time this task id first reached a pool process (later deliveries keep it),
    and, in this process, when this delivery reached it."""
    if task is not None and task.name in (LIMITED, BASELINE) and task_id:
        now = time.time()
        _delivered.update(task_id=task_id, at=now)
        _client(RECORD_ENV).set(first_ask_key(task_id), repr(now), nx=True, ex=3600)


@lock_contended.connect
def note_first_refusal(sender: Optional[Task] = None, task_id: Optional[str] = None,
                       **_: Any) -> None:
    """A limited run refused before it reached a pool process (the worker's main process
    asks first): that was its first ask, if it had none yet."""
    if sender is not None and sender.name == LIMITED and task_id:
        _client(RECORD_ENV).set(first_ask_key(task_id), repr(time.time()), nx=True, ex=3600)


@app.task(name=LIMITED, base=LimitedTask, bind=True, lock_slots=SLOTS, lock_key="run:{run}")
def limited(self: Task, run: str, seq: int, duration: float) -> None:
    """Sleep ``duration`` s in a slot; the package handles runs that find none free."""
    start = time.time()
    time.sleep(duration)
    _record(self, run, seq, start, time.time(), self.request.redislock_lease.acquired_at_ms)


@app.task(name=BASELINE, bind=True, max_retries=None)
def baseline(self: Task, run: str, seq: int, duration: float) -> None:
    """Sleep ``duration`` s in a slot taken without blocking; none free: retry in FIXED s."""
    semaphore = Semaphore(_client(LOCK_ENV), f"run:{run}", slots=SLOTS)
    lease = semaphore.acquire(blocking=False)
    if lease is None:
        # Unlimited retries come from the task's max_retries=None: in retry(), None means
        # "the task's own limit" (3 by default), not "no limit".
        raise self.retry(countdown=RETRY_COUNTDOWN)
    try:
        start = time.time()
        time.sleep(duration)
        _record(self, run, seq, start, time.time(), lease.acquired_at_ms)
    finally:
        semaphore.release(lease)


@app.task(name=WARMUP, bind=True)
def warmup(self: Task, run: str, seq: int, duration: float) -> None:
    """Record and return at once: brings every pool process up before timing."""
    _record(self, run, seq, time.time(), time.time())
