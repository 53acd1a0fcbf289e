"""The Celery app of ``bench_park_e2e``: design (c) with a real worker.

Runs wait as messages in a parking queue of the broker (``PARK``, which no worker
consumes); the lock store counts them (``lua/parked_*.lua``). A run of ``park.work``
claims its slot as its body starts (a prototype: the real design claims in the worker's
main process before the pool), records when it started, sleeps ``PARK_HOLD_MS``, then
releases: when the release reserves the slot for a waiter, the body moves one message
from the parking list to the work queue's list (``LMOVE``, atomic: kombu's Redis
transport keeps a queue as a list under its name) and records when.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

import redis
from celery import Celery

from celery_redislock.engine.keys import semaphore_key

WORK, PARK = "proto-work", "proto-park"
KEY = semaphore_key("park:e2e")
STATE, RESERVATIONS = KEY + ":l", KEY + ":rv"
LUA = Path(__file__).with_name("lua")
HOLD = float(os.environ.get("PARK_HOLD_MS", "0")) / 1000.0

app = Celery("redislock_proto_park", broker=os.environ["PARK_BROKER_URL"])
app.conf.update(task_default_queue=WORK, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False, task_ignore_result=True)

_clients: Dict[str, Any] = {}


def _client(name: str) -> Any:
    if name not in _clients:
        lock = redis.Redis.from_url(os.environ["PARK_LOCK_URL"])
        _clients.update(
            lock=lock, broker=redis.Redis.from_url(os.environ["PARK_BROKER_URL"]),
            record=redis.Redis.from_url(os.environ["PARK_RECORD_URL"]),
            release=lock.register_script((LUA / "parked_release.lua").read_text()),
            claim=lock.register_script((LUA / "parked_claim.lua").read_text()))
    return _clients[name]


@app.task(name="park.work")
def work(index: int, first: bool = False) -> None:
    member = f"run-{index}"
    if first:
        _client("lock").zadd(KEY, {member: time.time() * 1000 + 60000})
    elif _client("claim")(keys=[KEY, RESERVATIONS], args=[member, 60000]) != 1:
        raise RuntimeError(f"run {index} found no reservation")
    _client("record").rpush("starts", f"{index} {time.time()!r}")
    if HOLD:
        time.sleep(HOLD)
    released = time.time()
    if _client("release")(keys=[KEY, STATE, RESERVATIONS], args=[member, 10000]) == 1:
        moved: Optional[bytes] = _client("broker").lmove(PARK, WORK, "RIGHT", "LEFT")
        if moved is None:
            raise RuntimeError("the parking queue was empty")
        _client("record").rpush("releases", repr(released))
