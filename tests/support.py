"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from typing import Callable

#: Databases of the session's private redis-server used by the in-process Celery tests.
LOCK_DB, BROKER_DB = 0, 1

#: The lock store's incarnation key under the default prefix: written once per key space,
#: it never expires (see ``store.lua``).
INCARNATION = b"redislock:incarnation"

#: Task options that make a waiting task ask again quickly.
FAST_RETRY = {"lock_retry_backoff": 0.02, "lock_retry_backoff_max": 0.05}


def wait_until(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.01,
               what: str = "condition") -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
