"""The Celery app of ``test_parking_parity_line.py``'s real workers: :mod:`parking_app`'s
(same environment, same records), with tasks the parking line used to leave on today's
line: a ``lock_max_wait`` and a ``lock_cost`` of 2.

``units`` / ``unit_peaks`` (record store): the units of ``heavy`` held at once, counted
from inside the bodies, and that count as each body started.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask

from fault_app import fault_recorder
from parking_app import LEASE, RETRY
from parking_app import create_app as create_parking_app
from worker_app import BROKER_URL_ENV, AppUrls

#: Set: ``redislock_admit_before_pool = False`` (the pool process asks, and parks).
POOL_ASKS_ENV = "REDISLOCK_TEST_POOL_ASKS"

WAITS = "parity_app.waits"
HEAVY = "parity_app.heavy"
WAITS_PREFIX = "waits:"
#: ``waits``: one at a time, given up after this long (s).
MAX_WAIT = 1.0
#: ``heavy``: 3 units, each run takes 2.
UNITS, COST = 3, 2


def create_app(urls: AppUrls) -> Celery:
    """:mod:`parking_app`'s app with this module's tasks."""
    app = create_parking_app(urls)
    if os.environ.get(POOL_ASKS_ENV):
        app.conf.redislock_admit_before_pool = False

    def record() -> Any:
        return fault_recorder(urls.record)

    @app.task(base=LimitedTask, bind=True, shared=False, name=WAITS, lock_slots=1,
              lock_key=WAITS_PREFIX + "{key}", lock_lease=LEASE, lock_max_wait=MAX_WAIT,
              **RETRY)
    def waits(self: Any, seconds: float, key: str = "a", until: Optional[str] = None) -> str:
        """One at a time per key, for at most MAX_WAIT s of waiting; with ``until``, the
        body holds its slot until the test says ``go:<until>`` (at most ``seconds``)."""
        return str(record().work(self, [WAITS_PREFIX + key], seconds, until))

    @app.task(base=LimitedTask, bind=True, shared=False, name=HEAVY, lock_slots=UNITS,
              lock_key="heavy", lock_cost=COST, lock_lease=LEASE, **RETRY)
    def heavy(self: Any, seconds: float) -> str:
        """Two units of three."""
        client = record().client
        client.rpush("unit_peaks", client.incrby("units", COST))
        try:
            time.sleep(seconds)  # the simulated work
        finally:
            client.decrby("units", COST)
            client.incr(f"runs:{self.request.id}")
        return str(self.request.id)

    return app


#: The app of the worker processes.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
