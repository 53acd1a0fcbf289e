"""Four limited tasks, each pretending to work for a moment and recording its run.

* ``crawl``: at most 2 runs at once across every worker (one semaphore for the task).
* ``sync_customer``: at most 1 run at once per customer (a semaphore per customer id).
* ``rebuild_index``: a singleton, 1 run at a time across the cluster.
* ``ping_partner``: at most 4 starts a second per partner, across every worker (a rate
  limit, no slot limit).

The retry backoffs are small so that a burst of tasks drains in a few seconds.
"""

from __future__ import annotations

import random
import time
from typing import Any

from celery import Task
from celery.signals import task_received

from celery_redislock import LimitedTask, SingletonTask
from proj.app import app
from proj.records import recorder

#: Short waits between tries for a slot: the demo's tasks hold their slots briefly.
FAST_RETRY: dict[str, Any] = {
    "lock_retry_backoff": 0.1,
    "lock_retry_backoff_max": 0.5,
}


@task_received.connect
def count_delivery(request: Any, **_: Any) -> None:
    """Every delivery of a run to a worker passes here (in the worker's main process,
    which decides whether the run may start), including the copies of its message sent
    back to wait for a slot: a run that waits never reaches a pool process."""
    recorder().delivered(request.id)


def pretend_to_work(task: Task, seconds: tuple[float, float], key: str = "") -> str:
    """Record the start, sleep a random time within ``seconds`` (the "work"), record the
    end; return the limit key.

    The key is the name of the semaphore the lease holds; a run admitted by a rate limit
    only holds no slot, so its lease has no name and the task says its ``key``.
    """
    lease = task.request.redislock_lease
    name = lease.name or key
    runs = recorder()
    waits = runs.times_sent_back(task.request.id)
    runs.started(task.request.id, name, slots=task.lock_slots or 0, waits=waits,
                 admitted_ms=lease.acquired_at_ms)
    try:
        time.sleep(random.uniform(*seconds))
    finally:
        runs.ended(task.request.id, name)
    return name


@app.task(bind=True, base=LimitedTask, lock_slots=2, **FAST_RETRY)
def crawl(self: Task, url: str) -> str:
    """Fetch ``url`` (pretend): at most two crawls run at once, cluster-wide."""
    return pretend_to_work(self, (0.4, 0.9))


@app.task(bind=True, base=LimitedTask, lock_slots=1, lock_key="customer:{customer_id}",
          **FAST_RETRY)
def sync_customer(self: Task, customer_id: int, full: bool = False) -> str:
    """Synchronise one customer (pretend): one run at a time per customer."""
    return pretend_to_work(self, (0.3, 0.8))


@app.task(bind=True, base=SingletonTask, **FAST_RETRY)
def rebuild_index(self: Task) -> str:
    """Rebuild the search index (pretend): one run at a time, cluster-wide."""
    return pretend_to_work(self, (0.3, 0.8))


@app.task(bind=True, base=LimitedTask, lock_rate="4/s", lock_key="partner:{partner}")
def ping_partner(self: Task, partner: str) -> str:
    """Call a partner's API (pretend): at most 4 starts a second per partner, cluster-wide."""
    return pretend_to_work(self, (0.2, 0.6), key=f"partner:{partner}")
