"""The Celery app of the peer comparison, loaded both by the worker and by the sender.

Every URL comes from the environment:

``REDISLOCK_BENCH_BROKER_URL``    broker
``REDISLOCK_BENCH_BACKEND_URL``   result backend (the sender, which reads results itself
                                  with one ``MGET``, uses ``disabled``)
``REDISLOCK_BENCH_LOCK_URL``      the lock store of every kind: this package's
                                  ``redislock_url``, celery-once's and celery-singleton's
``REDISLOCK_BENCH_COUNTER_URL``   where finished runs are counted (not the lock store, so
                                  that its command counts are the locks' alone)

Five kinds of no-op task, each taking one argument (unique per run, so that the peers,
which lock on the task's arguments, never find a duplicate):

* ``plain``: a plain task;
* ``slots``: ``LimitedTask`` with ``lock_slots`` far above the worker's processes;
* ``rate``: ``LimitedTask`` with a ``lock_rate`` far above the throughput (never refused);
* ``unique``: a plain task made unique at enqueue by a ``redislock_limits`` entry
  (``unique``, keyed by its argument) and :func:`celery_redislock.install`: this package's
  counterpart of the two below (locks in ``apply_async``, unlocks when the run ends);
* ``once``: celery-once's ``QueueOnce`` (locks in ``apply_async``, on the sender; unlocks
  in ``after_return``);
* ``singleton``: celery-singleton's ``Singleton`` (locks in ``apply_async``; unlocks in
  ``on_success``).

Each kind exists twice: ``peers.<kind>.ignored`` stores no result, ``peers.<kind>.stored``
does. A ``task_postrun`` handler counts each finished run with one ``INCR`` of
``bench:done:<task name>``; it fires after every kind's release call.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import redis
from celery import Celery, Task
from celery.signals import task_postrun

import celery_redislock
from celery_redislock import LimitedTask

from . import fake_store

try:
    from celery_once import QueueOnce
except ImportError:  # the bench extra is not installed: that kind is left out
    QueueOnce = None
try:
    from celery_singleton import Singleton
except ImportError:
    Singleton = None

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
BACKEND_ENV = "REDISLOCK_BENCH_BACKEND_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
COUNTER_ENV = "REDISLOCK_BENCH_COUNTER_URL"

QUEUE = "redislock-bench-peers"
#: Far more slots than the worker has processes: the ``slots`` kind is never contended.
SLOTS = 1000
#: Far above any throughput here, with a burst to spare: the ``rate`` kind is never refused.
RATE, BURST = "100000/s", 100
PLAIN = "plain"
UNIQUE = "unique"
MODES = ("ignored", "stored")


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set")
    return value


LOCK_URL = _required_env(LOCK_ENV)

app = Celery(
    "redislock_bench_peers",
    broker=_required_env(BROKER_ENV),
    backend=_required_env(BACKEND_ENV),
)
app.conf.update(
    redislock_url=LOCK_URL,
    ONCE={"backend": "celery_once.backends.Redis",
          "settings": {"url": LOCK_URL, "default_timeout": 3600}},
    singleton_backend_url=LOCK_URL,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # BENCH_POOL_ASKS=1: the pool processes ask the limits (redislock_admit_before_pool
    # False), as before admission moved to the worker's main process.
    redislock_admit_before_pool=os.environ.get("BENCH_POOL_ASKS") != "1",
)
if os.environ.get(fake_store.ENV) in fake_store.MODES.values():  # see fake_store
    fake_store.install(os.environ[fake_store.ENV])


def kind_options() -> Dict[str, Tuple[Optional[type], Dict[str, Any]]]:
    """Each kind's base class and task options; kinds whose library is missing are left out."""
    kinds: Dict[str, Tuple[Optional[type], Dict[str, Any]]] = {
        PLAIN: (None, {}),
        "slots": (LimitedTask, {"lock_slots": SLOTS}),
        "rate": (LimitedTask, {"lock_rate": RATE, "lock_burst": BURST}),
        UNIQUE: (None, {}),
    }
    if QueueOnce is not None:
        kinds["once"] = (QueueOnce, {"once": {"graceful": True}})
    if Singleton is not None:
        kinds["singleton"] = (Singleton, {})
    return kinds


KINDS: List[str] = list(kind_options())


def task_name(kind: str, mode: str) -> str:
    """The name of the no-op task of ``kind`` in ``mode`` (``ignored`` or ``stored``)."""
    return f"peers.{kind}.{mode}"


def counter_key(name: str) -> str:
    """The key that counts finished runs of task ``name``."""
    return f"bench:done:{name}"


def noop(run: str) -> None:
    """A task that does nothing."""


def _define_tasks() -> None:
    for kind, (base, options) in kind_options().items():
        for mode in MODES:
            extra = dict(options)
            if base is not None:
                extra["base"] = base
            app.task(name=task_name(kind, mode), ignore_result=mode == "ignored",
                     **extra)(noop)


_define_tasks()
app.conf.redislock_limits = {
    task_name(UNIQUE, mode): {"unique": True, "key": "peers:{run}"} for mode in MODES
}
celery_redislock.install(app)

_counter_client: Optional[redis.Redis] = None


def _counter() -> redis.Redis:
    """This process's client of the counters, made on first use (after any fork)."""
    global _counter_client
    if _counter_client is None:
        _counter_client = redis.Redis.from_url(_required_env(COUNTER_ENV))
    return _counter_client


@task_postrun.connect
def count_finished(sender: Optional[Task] = None, **_: Any) -> None:
    """Count one finished run of the task that just ran."""
    if sender is not None and sender.name.startswith("peers."):
        _counter().incr(counter_key(sender.name))
