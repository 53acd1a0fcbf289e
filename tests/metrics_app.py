"""The Celery app of the real workers in ``test_metrics.py``: limited tasks, the Prometheus
exporter, and receivers that record every signal of the package.

The workers run ``celery -A metrics_app worker``; their URLs come from the environment
(see :class:`worker_app.AppUrls`). The exporter listens on any free port of 127.0.0.1,
which the worker logs (see :func:`exporter_url`). Each task body records the process it
ran in (set ``pids``) and the server time it started (hash ``started``), and the signal
receivers push one JSON line per signal to the list ``signals`` of the record store::

    {"signal": "lock_contended", "sender": "metrics_app.contended",
     "kwargs": ["countdown", "key", "reason", "task_id"], "task_id": "...",
     "key": "metrics_app.contended", "countdown": 0.03, "reason": "..."}
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Dict, Optional

import redis
from celery import Celery

from celery_redislock import LimitedTask
from celery_redislock.integration import signals
from celery_redislock.metrics import default_limit_label
from celery_redislock.metrics.prometheus import enable_prometheus

from worker_app import BROKER_URL_ENV, AppUrls

CONTENDED = "metrics_app.contended"
RATED = "metrics_app.rated"
PER_CUSTOMER = "metrics_app.per_customer"
TEMPLATED = "metrics_app.templated"
SHORT_LEASE = "metrics_app.short_lease"
FAIR = "metrics_app.fair"

#: The most distinct values of the ``limit`` label the workers let through.
MAX_LIMIT_LABELS = 8

#: Starts per second of :data:`RATED`, one interval apart (burst 0): slow enough that a
#: run's start is further off than the worker books one, so that runs park at the rate's
#: line (which the rate-limited metrics count).
RATE = 2

FAST_RETRY: Dict[str, float] = {"lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.2}

_EXPORTER_LINE = re.compile(r"Prometheus metrics on (http://[\d.]+:\d+/metrics)")


def limit_label(task: Any, key: Optional[str]) -> str:
    """One label per customer for :data:`PER_CUSTOMER` (which the label budget must
    bound), the package's default label for every other task."""
    if task.name == PER_CUSTOMER and key:
        return key
    return default_limit_label(task, key)


def exporter_url(log_text: str) -> Optional[str]:
    """The exporter's URL, from a worker's log."""
    found = _EXPORTER_LINE.search(log_text)
    return found.group(1) if found else None


class _Records:
    """One record-store client per process (redis-py reconnects after a fork)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=10)

    def run(self, task_id: str, seconds: float) -> None:
        seconds_now, micros = self.client.time()
        self.client.hset("started", task_id, int(seconds_now) * 1_000_000 + int(micros))
        self.client.sadd("pids", os.getpid())
        self.client.hset("pid", task_id, os.getpid())
        time.sleep(seconds)  # the simulated work of the task body


def create_app(urls: AppUrls) -> Celery:
    """The app, with its tasks, settings and exporter (a worker's bootstep)."""
    app = Celery("metrics_app", broker=urls.broker, backend=urls.backend,
                 set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        redislock_metrics_port=0,
        redislock_metrics_addr="127.0.0.1",
        redislock_metrics_max_limits=MAX_LIMIT_LABELS,
        redislock_metrics_limit_label="metrics_app:limit_label",
    )
    enable_prometheus(app)
    records = _Records(urls.record)

    @app.task(base=LimitedTask, bind=True, shared=False, name=CONTENDED, lock_slots=1,
              **FAST_RETRY)
    def contended(self: Any, seconds: float) -> str:
        records.run(self.request.id, seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED, lock_rate=f"{RATE}/s",
              lock_burst=0)
    def rated(self: Any) -> str:
        records.run(self.request.id, 0)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=PER_CUSTOMER, lock_slots=1,
              lock_key="customer:{customer_id}", **FAST_RETRY)
    def per_customer(self: Any, customer_id: int) -> int:
        records.run(self.request.id, 0.01)
        return customer_id

    @app.task(base=LimitedTask, bind=True, shared=False, name=TEMPLATED, lock_slots=1,
              lock_key="customer:{customer_id}", **FAST_RETRY)
    def templated(self: Any, customer_id: int) -> int:
        records.run(self.request.id, 0.01)
        return customer_id

    @app.task(base=LimitedTask, bind=True, shared=False, name=SHORT_LEASE, lock_slots=1,
              lock_lease=1, **FAST_RETRY)
    def short_lease(self: Any, seconds: float) -> str:
        records.run(self.request.id, seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=FAIR, lock_slots=1,
              lock_fair_by="tenant:{tenant}", **FAST_RETRY)
    def fair(self: Any, tenant: str, seconds: float) -> str:
        records.run(self.request.id, seconds)
        return tenant

    return app


def _record_signals(url: str) -> None:
    """Push every signal of the package, with the names of its kwargs, to ``signals``."""
    client = redis.Redis.from_url(url, socket_timeout=10)

    def receiver(name: str) -> Any:
        def record(sender: Any = None, signal: Any = None, **kwargs: Any) -> None:
            entry: Dict[str, Any] = {"signal": name, "sender": getattr(sender, "name", None),
                                     "kwargs": sorted(kwargs), "pid": os.getpid()}
            for field, value in kwargs.items():
                if field == "lease":
                    entry["lease_name"] = value.name
                    entry["lease_fence"] = value.fence
                else:
                    entry[field] = value
            client.rpush("signals", json.dumps(entry))
        return record

    for name in ("lock_acquired", "lock_contended", "rate_limited", "lock_released",
                 "lease_lost"):
        getattr(signals, name).connect(receiver(name), weak=False)


#: The app of the worker processes, which find the URLs in their environment.
app: Optional[Celery] = None
if BROKER_URL_ENV in os.environ:
    _urls = AppUrls.from_environment()
    app = create_app(_urls)
    _record_signals(_urls.record)
