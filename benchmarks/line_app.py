"""The Celery app of the waiting-line benchmark (``bench_line.py``), for workers and sender.

``REDISLOCK_BENCH_BROKER_URL`` broker and records (database 0 and 2),
``REDISLOCK_BENCH_LOCK_URL`` the lock store alone. One task, ``bench.line.drain``: one
slot of the key ``line``, a body of 10 ms, no result stored; each body that ends pushes
its end time (Redis server clock, µs) to the list ``bench:line:ends``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis
from celery import Celery

from celery_redislock import LimitedTask

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
RECORD_ENV = "REDISLOCK_BENCH_RECORD_URL"
DRAIN = "bench.line.drain"
KEY = "line"
ENDS = "bench:line:ends"
BODY_SECONDS = 0.01

app = Celery("line_app", broker=os.environ.get(BROKER_ENV, "memory://"),
             set_as_current=False)
app.conf.update(redislock_url=os.environ.get(LOCK_ENV, "redis://localhost:6379/15"),
                broker_connection_retry_on_startup=True, worker_prefetch_multiplier=1,
                task_ignore_result=True)

_records: dict = {}


def _record() -> Optional[redis.Redis]:
    url = os.environ.get(RECORD_ENV)
    if url and "client" not in _records:
        _records["client"] = redis.Redis.from_url(url)
    return _records.get("client")


@app.task(name=DRAIN, base=LimitedTask, bind=True, lock_slots=1, lock_key=KEY)
def drain(self: Any, seq: int) -> None:
    """10 ms in the one slot of ``line``."""
    time.sleep(BODY_SECONDS)
    client = _record()
    if client is not None:
        seconds, micros = client.time()
        client.rpush(ENDS, seconds * 1_000_000 + micros)
