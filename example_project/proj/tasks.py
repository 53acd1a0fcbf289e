"""Three limited tasks, each pretending to work for 0.1-0.4 s and recording its run.

* ``crawl``: at most 2 runs at once across every worker (one semaphore for the task).
* ``sync_customer``: at most 1 run at once per customer (a semaphore per customer id).
* ``rebuild_index``: a singleton, 1 run at a time across the cluster.

The retry backoffs are small so that a burst of tasks drains in a few seconds.
"""

from __future__ import annotations

import random
import time
from typing import Any

from celery import Task
from celery.signals import task_prerun

from celery_redislock import LimitedTask, SingletonTask
from proj.app import app
from proj.records import recorder

#: Short waits between tries for a slot: the demo's tasks hold their slots briefly.
FAST_RETRY: dict[str, Any] = {
    "lock_retry_backoff": 0.1,
    "lock_retry_backoff_max": 0.5,
}


@task_prerun.connect
def count_delivery(task_id: str, **_: Any) -> None:
    """Every delivery of a run passes here, including those sent back to wait for a slot."""
    recorder().delivered(task_id)


def pretend_to_work(task: Task) -> str:
    """Record the start, sleep 0.1-0.4 s (the "work"), record the end; return the key held."""
    lease = task.request.redislock_lease
    runs = recorder()
    waits = runs.times_sent_back(task.request.id)
    runs.started(task.request.id, lease.name, slots=task.lock_slots, waits=waits)
    try:
        time.sleep(random.uniform(0.1, 0.4))
    finally:
        runs.ended(task.request.id, lease.name)
    return lease.name


@app.task(bind=True, base=LimitedTask, lock_slots=2, **FAST_RETRY)
def crawl(self: Task, url: str) -> str:
    """Fetch ``url`` (pretend): at most two crawls run at once, cluster-wide."""
    return pretend_to_work(self)


@app.task(bind=True, base=LimitedTask, lock_slots=1, lock_key="customer:{customer_id}",
          **FAST_RETRY)
def sync_customer(self: Task, customer_id: int, full: bool = False) -> str:
    """Synchronise one customer (pretend): one run at a time per customer."""
    return pretend_to_work(self)


@app.task(bind=True, base=SingletonTask, **FAST_RETRY)
def rebuild_index(self: Task) -> str:
    """Rebuild the search index (pretend): one run at a time, cluster-wide."""
    return pretend_to_work(self)
