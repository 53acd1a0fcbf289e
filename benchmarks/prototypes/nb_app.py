"""The Celery app of ``bench_admission``, loaded by the worker and by the sender.

The peer benchmark's app (``benchmarks/peers_app.py``, same environment variables) with
two more kinds: ``hub``, the same ``admit.lua`` as ``slots`` (1000 slots, never
contended), asked from the worker's main process without blocking (``hub_gate``); and
``gate``, ``slots`` under the package's ``redislock_gate = "async"``. Every
task sleeps ``NB_TASK_SECONDS`` (default 0: a no-op).
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
except ImportError:
    QueueOnce = None
try:
    from celery_singleton import Singleton
except ImportError:
    Singleton = None

QUEUE = "redislock-bench-nb"
SLOTS = 1000
PLAIN = "plain"
MODES = ("ignored", "stored")
TASK_SECONDS = float(os.environ.get("NB_TASK_SECONDS", "0"))
LOCK_URL = os.environ["REDISLOCK_BENCH_LOCK_URL"]

app = Celery("redislock_bench_nb", broker=os.environ["REDISLOCK_BENCH_BROKER_URL"],
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


class HubTask(Task):
    """A task whose slot is asked for by the prototype gate (see ``hub_gate``)."""

    Strategy = "benchmarks.prototypes.hub_gate:hub_strategy"
    hub_limit: Tuple[str, int] = ("nb:hub", SLOTS)


def kind_options() -> Dict[str, Tuple[Optional[type], Dict[str, Any]]]:
    kinds: Dict[str, Tuple[Optional[type], Dict[str, Any]]] = {
        PLAIN: (None, {}),
        "slots": (LimitedTask, {"lock_slots": SLOTS}),
        "hub": (HubTask, {}),
        "gate": (LimitedTask, {"lock_slots": SLOTS}),
    }
    if QueueOnce is not None:
        kinds["once"] = (QueueOnce, {"once": {"graceful": True}})
    if Singleton is not None:
        kinds["singleton"] = (Singleton, {})
    return kinds


KINDS: List[str] = list(kind_options())


def task_name(kind: str, mode: str) -> str:
    return f"nb.{kind}.{mode}"


def counter_key(name: str) -> str:
    return f"bench:done:{name}"


def work(run: str) -> None:
    """A task that sleeps ``NB_TASK_SECONDS`` (nothing by default)."""
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
def _gate_kind_asks_async(sender: Any, **_: Any) -> None:
    """The ``gate`` kind: ``slots`` under ``redislock_gate = "async"`` (the package's
    own gate, made real from ``hub_gate``), for its tasks only, beside ``slots``."""
    async_settings = dataclasses.replace(read_settings(sender), gate="async")
    for mode in MODES:
        sender.tasks[task_name("gate", mode)]._redislock_settings = async_settings

_counter_client: Optional[redis.Redis] = None


@task_postrun.connect
def count_finished(sender: Optional[Task] = None, **_: Any) -> None:
    global _counter_client
    if sender is not None and sender.name.startswith("nb."):
        if _counter_client is None:
            _counter_client = redis.Redis.from_url(os.environ["REDISLOCK_BENCH_COUNTER_URL"])
        _counter_client.incr(counter_key(sender.name))
