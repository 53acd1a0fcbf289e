"""The Celery app of the waiting-line benchmark (``bench_line.py``), for workers and sender.

``REDISLOCK_BENCH_BROKER_URL`` broker and records (database 0 and 2),
``REDISLOCK_BENCH_LOCK_URL`` the lock store alone, ``REDISLOCK_BENCH_LINE`` the line
(``redislock_line``: ``broker``; unset: the package's default). One task,
``bench.line.drain``: one slot of the key ``line:<k>``, a body of 10 ms, no result
stored; each body pushes ``"<k> <start µs> <end µs>"`` (Redis server clock) to the list
``bench:line:ends`` as it ends. Another tenant's task, ``bench.line.other``: one slot of
its own key ``other``, which has no line; each body pushes ``"<start µs>"`` to
``bench:line:other`` as it starts.
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
LINE_ENV = "REDISLOCK_BENCH_LINE"
DRAIN = "bench.line.drain"
OTHER = "bench.line.other"
KEY = "line:{k}"
ENDS = "bench:line:ends"
OTHER_STARTS = "bench:line:other"
BODY_SECONDS = 0.01

app = Celery("line_app", broker=os.environ.get(BROKER_ENV, "memory://"),
             set_as_current=False)
app.conf.update(redislock_url=os.environ.get(LOCK_ENV, "redis://localhost:6379/15"),
                broker_connection_retry_on_startup=True, worker_prefetch_multiplier=1,
                task_ignore_result=True)
if os.environ.get(LINE_ENV):
    app.conf.redislock_line = os.environ[LINE_ENV]

_records: dict = {}


def _record() -> Optional[redis.Redis]:
    url = os.environ.get(RECORD_ENV)
    if url and "client" not in _records:
        _records["client"] = redis.Redis.from_url(url)
    return _records.get("client")


@app.task(name=DRAIN, base=LimitedTask, bind=True, lock_slots=1, lock_key=KEY)
def drain(self: Any, seq: int, k: int = 0) -> None:
    """10 ms in the one slot of ``line:<k>``."""
    client = _record()
    started = _server_us(client) if client is not None else 0
    time.sleep(BODY_SECONDS)
    if client is not None:
        client.rpush(ENDS, f"{k} {started} {_server_us(client)}")


@app.task(name=OTHER, base=LimitedTask, lock_slots=1, lock_key="other")
def other() -> None:
    """Another tenant's run: its own key, no line; records its start."""
    client = _record()
    if client is not None:
        client.rpush(OTHER_STARTS, _server_us(client))


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)
