"""The Celery app of ``bench_admission``, loaded by the worker and by the sender.

The peer benchmark's environment (``benchmarks/peers_app.py``: broker, backend, lock
store and counter URLs) with these kinds, each a task that sleeps
``ADMISSION_TASK_SECONDS`` (default 0: a no-op) and takes one argument unique per run:

* ``plain``: a plain task;
* ``blocking``: ``LimitedTask`` with ``lock_slots`` far above the worker's processes
  (never contended), its admission asked with a blocking call (``redislock_gate =
  "blocking"``, the default);
* ``async``: the same, asked without blocking from the worker's event loop
  (``redislock_gate = "async"``), with its look-ahead;
* ``parked``: ``async`` on the parking line (``redislock_line = "broker"``:
  ``admit_parked.lua``, the slots-only script);
* ``once``: celery-once's ``QueueOnce``; ``singleton``: celery-singleton's ``Singleton``
  (both lock in ``apply_async``, on the sender, and unlock at the run's end).

Each kind exists twice: ``adm.<kind>.ignored`` stores no result, ``adm.<kind>.stored``
does. A ``task_postrun`` handler counts each finished run with one ``INCR``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import redis
from celery import Celery, Task
from celery.signals import task_postrun

import celery_redislock
from celery_redislock import LimitedTask
from celery_redislock.config.settings import read_settings

try:
    from celery_once import QueueOnce
except ImportError:  # the bench extra is not installed: that kind is left out
    QueueOnce = None
try:
    from celery_singleton import Singleton
except ImportError:
    Singleton = None

QUEUE = "redislock-bench-admission"
#: Far more slots than the worker has processes: the limited kinds are never contended.
SLOTS = 1000
PLAIN = "plain"
MODES = ("ignored", "stored")
TASK_SECONDS = float(os.environ.get("ADMISSION_TASK_SECONDS", "0"))
LOCK_URL = os.environ["REDISLOCK_BENCH_LOCK_URL"]

app = Celery("redislock_bench_admission", broker=os.environ["REDISLOCK_BENCH_BROKER_URL"],
             backend=os.environ["REDISLOCK_BENCH_BACKEND_URL"])
app.conf.update(
    redislock_url=LOCK_URL,
    ONCE={"backend": "celery_once.backends.Redis",
          "settings": {"url": LOCK_URL, "default_timeout": 3600}},
    singleton_backend_url=LOCK_URL,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

#: The package settings each limited kind runs under (beside the app's defaults).
SETTINGS: Dict[str, Dict[str, str]] = {
    "blocking": {"gate": "blocking"},
    "async": {"gate": "async"},
    "parked": {"gate": "async", "line": "broker"},
}


def kind_options() -> Dict[str, Tuple[Optional[type], Dict[str, Any]]]:
    """Each kind's base class and task options; kinds whose library is missing are left out."""
    kinds: Dict[str, Tuple[Optional[type], Dict[str, Any]]] = {PLAIN: (None, {})}
    for kind in SETTINGS:
        kinds[kind] = (LimitedTask, {"lock_slots": SLOTS, "lock_key": f"adm-{kind}"})
    if QueueOnce is not None:
        kinds["once"] = (QueueOnce, {"once": {"graceful": True}})
    if Singleton is not None:
        kinds["singleton"] = (Singleton, {})
    return kinds


KINDS: List[str] = list(kind_options())


def task_name(kind: str, mode: str) -> str:
    return f"adm.{kind}.{mode}"


def counter_key(name: str) -> str:
    return f"bench:done:{name}"


def work(run: str) -> None:
    """A task that sleeps ``ADMISSION_TASK_SECONDS`` (nothing by default)."""
    if TASK_SECONDS:
        time.sleep(TASK_SECONDS)


for _kind, (_base, _options) in kind_options().items():
    for _mode in MODES:
        _extra = dict(_options)
        if _base is not None:
            _extra["base"] = _base
        app.task(name=task_name(_kind, _mode), ignore_result=_mode == "ignored",
                 **_extra)(work)
celery_redislock.install(app)


@app.on_after_finalize.connect
def _kind_settings(sender: Any, **_: Any) -> None:
    """Each limited kind's own ``redislock_gate`` and ``redislock_line``."""
    base = read_settings(sender)
    for kind, changes in SETTINGS.items():
        settings = dataclasses.replace(base, **changes)
        for mode in MODES:
            sender.tasks[task_name(kind, mode)]._redislock_settings = settings


_counter_client: Optional[redis.Redis] = None


@task_postrun.connect
def count_finished(sender: Optional[Task] = None, **_: Any) -> None:
    global _counter_client
    if sender is not None and sender.name.startswith("adm."):
        if _counter_client is None:
            _counter_client = redis.Redis.from_url(os.environ["REDISLOCK_BENCH_COUNTER_URL"])
        _counter_client.incr(counter_key(sender.name))
