"""The Celery app of the fair-share benchmark (``bench_fair_share.py``), for workers and
sender, on the parking line (``redislock_line = "broker"``).

``REDISLOCK_BENCH_BROKER_URL`` broker, ``REDISLOCK_BENCH_LOCK_URL`` the lock store alone,
``REDISLOCK_BENCH_RECORD_URL`` records, ``REDISLOCK_BENCH_SLOTS`` the global cap. One
task, ``bench.fair.work(tenant, seconds, n)``: at most ``SLOTS`` at once over every
tenant, its line served round-robin across tenants (``fair_by``); each body pushes
``"<tenant> <n> <start µs> <end µs>"`` (the records server's clock) to ``bench:fair:runs``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

import redis
from celery import Celery

from celery_redislock import LimitedTask

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
RECORD_ENV = "REDISLOCK_BENCH_RECORD_URL"
SLOTS_ENV = "REDISLOCK_BENCH_SLOTS"
WORK = "bench.fair.work"
GLOBAL = "fair:global"
RUNS = "bench:fair:runs"
SLOTS = int(os.environ.get(SLOTS_ENV, "4"))

app = Celery("fair_share_app", broker=os.environ.get(BROKER_ENV, "memory://"),
             set_as_current=False)
app.conf.update(redislock_url=os.environ.get(LOCK_ENV, "redis://localhost:6379/15"),
                broker_connection_retry_on_startup=True, worker_prefetch_multiplier=1,
                task_ignore_result=True, redislock_line="broker",
                redislock_limits={WORK: [{"slots": SLOTS, "key": GLOBAL,
                                          "fair_by": "tenant:{tenant}", "lease": 60}]})

_records: Dict[str, redis.Redis] = {}


def _record() -> redis.Redis:
    if "client" not in _records:
        _records["client"] = redis.Redis.from_url(os.environ[RECORD_ENV])
    return _records["client"]


@app.task(name=WORK, base=LimitedTask, bind=True)
def work(self: Any, tenant: str, seconds: float, n: int = 0) -> None:
    """``seconds`` in one of the global slots."""
    client = _record()
    started = _server_us(client)
    time.sleep(seconds)
    client.rpush(RUNS, f"{tenant} {n} {started} {_server_us(client)}")


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)
