"""The Celery app of ``bench_admission``, loaded by the worker and by the sender.

Its environment, task names and counters are :mod:`benchmarks.app_common`'s (shared with
``benchmarks/peers_app.py``). These kinds, each a task that sleeps
``ADMISSION_TASK_SECONDS`` (default 0: a no-op) and takes one argument unique per run:

* ``plain``: a plain task;
* ``blocking``: ``LimitedTask`` with ``lock_slots`` far above the worker's processes
  (never contended), its admission asked with a blocking call (``redislock_gate =
  "blocking"``, the default);
* ``async``: the same, asked without blocking from the worker's event loop
  (``redislock_gate = "async"``), with its look-ahead;
* ``parked``: ``async`` on the parking line (``redislock_line = "broker"``:
  ``admit_parked.lua``, the slots-only script);
* ``parked_no_hand_on``: ``parked`` with ``redislock_hand_on = False`` (every slot
  back through the lock store, see :mod:`celery_redislock.gate.hand_on`);
* ``once``: celery-once's ``QueueOnce``; ``singleton``: celery-singleton's ``Singleton``
  (both lock in ``apply_async``, on the sender, and unlock at the run's end).

Each kind exists twice: ``adm.<kind>.ignored`` stores no result, ``adm.<kind>.stored``
does; a ``task_postrun`` handler counts each finished run.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional

from celery import Task
from celery.signals import task_postrun

import celery_redislock
from celery_redislock import LimitedTask
from celery_redislock.config.settings import read_settings

from . import app_common
from .app_common import MODES, PLAIN, SLOTS, KindOptions
from .app_common import counter_key as counter_key

QUEUE = "redislock-bench-admission"
TASK_SECONDS = float(os.environ.get("ADMISSION_TASK_SECONDS", "0"))

app = app_common.make_app("redislock_bench_admission", QUEUE)

#: The package settings each limited kind runs under (beside the app's defaults).
SETTINGS: Dict[str, Dict[str, Any]] = {
    "blocking": {"gate": "blocking"},
    "async": {"gate": "async"},
    "parked": {"gate": "async", "line": "broker"},
    "parked_no_hand_on": {"gate": "async", "line": "broker", "hand_on": False},
}


def kind_options() -> KindOptions:
    """Each kind's base class and task options; kinds whose library is missing are left out."""
    kinds: KindOptions = {PLAIN: (None, {})}
    for kind in SETTINGS:
        kinds[kind] = (LimitedTask, {"lock_slots": SLOTS, "lock_key": f"adm-{kind}"})
    return {**kinds, **app_common.peer_kinds()}


KINDS: List[str] = list(kind_options())


def task_name(kind: str, mode: str) -> str:
    """The name of the task of ``kind`` in ``mode`` (``ignored`` or ``stored``)."""
    return f"adm.{kind}.{mode}"


def work(run: str) -> None:
    """A task that sleeps ``ADMISSION_TASK_SECONDS`` (nothing by default)."""
    if TASK_SECONDS:
        time.sleep(TASK_SECONDS)


app_common.define_tasks(app, kind_options(), task_name, work)
celery_redislock.install(app)


@app.on_after_finalize.connect
def _kind_settings(sender: Any, **_: Any) -> None:
    """Each limited kind's own ``redislock_gate`` and ``redislock_line``."""
    base = read_settings(sender)
    for kind, changes in SETTINGS.items():
        settings = dataclasses.replace(base, **changes)
        for mode in MODES:
            sender.tasks[task_name(kind, mode)]._redislock_settings = settings


@task_postrun.connect
def count_finished(sender: Optional[Task] = None, **_: Any) -> None:
    """Count one finished run of the task that just ran."""
    app_common.count_finished(sender, "adm.")
