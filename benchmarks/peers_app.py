"""The Celery app of the peer comparison, loaded both by the worker and by the sender.

Its environment, task names and counters are :mod:`benchmarks.app_common`'s. Six kinds
of no-op task:

* ``plain``: a plain task;
* ``slots``: ``LimitedTask`` with ``lock_slots`` far above the worker's processes;
* ``rate``: ``LimitedTask`` with a ``lock_rate`` far above the throughput (never refused);
* ``unique``: a plain task made unique at enqueue by a ``redislock_limits`` entry
  (``unique``, keyed by its argument) and :func:`celery_redislock.install`: this package's
  counterpart of the two below (locks in ``apply_async``, unlocks when the run ends);
* ``once``: celery-once's ``QueueOnce``; ``singleton``: celery-singleton's ``Singleton``
  (:func:`benchmarks.app_common.peer_kinds`).

Each kind exists twice: ``peers.<kind>.ignored`` stores no result, ``peers.<kind>.stored``
does; a ``task_postrun`` handler counts each finished run.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from celery import Task
from celery.signals import task_postrun

import celery_redislock
from celery_redislock import LimitedTask

from . import app_common, fake_store, main_calls
from .app_common import MODES, PLAIN, SLOTS, KindOptions
from .app_common import counter_key as counter_key

QUEUE = "redislock-bench-peers"
#: Far above any throughput here, with a burst to spare: the ``rate`` kind is never refused.
RATE, BURST = "100000/s", 100
UNIQUE = "unique"

app = app_common.make_app(
    "redislock_bench_peers", QUEUE,
    # BENCH_POOL_ASKS=1: the pool processes ask the limits (redislock_admit_before_pool
    # False), as before admission moved to the worker's main process.
    redislock_admit_before_pool=os.environ.get("BENCH_POOL_ASKS") != "1",
)
if os.environ.get(fake_store.ENV) in fake_store.MODES.values():  # see fake_store
    fake_store.install(os.environ[fake_store.ENV])
if os.environ.get(main_calls.ENV):  # see main_calls: the main process profiles itself
    main_calls.install(os.environ[main_calls.ENV])


def kind_options() -> KindOptions:
    """Each kind's base class and task options; kinds whose library is missing are left out."""
    return {
        PLAIN: (None, {}),
        "slots": (LimitedTask, {"lock_slots": SLOTS}),
        "rate": (LimitedTask, {"lock_rate": RATE, "lock_burst": BURST}),
        UNIQUE: (None, {}),
        **app_common.peer_kinds(),
    }


KINDS: List[str] = list(kind_options())


def task_name(kind: str, mode: str) -> str:
    """The name of the no-op task of ``kind`` in ``mode`` (``ignored`` or ``stored``)."""
    return f"peers.{kind}.{mode}"


def noop(run: str) -> None:
    """A task that does nothing."""


app_common.define_tasks(app, kind_options(), task_name, noop)
app.conf.redislock_limits = {
    task_name(UNIQUE, mode): {"unique": True, "key": "peers:{run}"} for mode in MODES
}
celery_redislock.install(app)


@task_postrun.connect
def count_finished(sender: Optional[Task] = None, **_: Any) -> None:
    """Count one finished run of the task that just ran."""
    app_common.count_finished(sender, "peers.")
