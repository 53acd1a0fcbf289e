"""The Celery app of the soak test: many keys, three slot limits, acks_late.

The lock store is a Redis server of its own (``REDISLOCK_TEST_SOAK_LOCK_URL``), so the test
can restart it while the broker keeps running. Bodies record their runs with
:class:`fault_app.FaultRecorder`, which tells a killed body from a running one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask

from fault_app import fault_recorder
from worker_app import BROKER_URL_ENV, FAST_RETRY, AppUrls

LOCK_URL_ENV = "REDISLOCK_TEST_SOAK_LOCK_URL"

#: Task name for each number of slots; a key is always used with the same one.
TASK_FOR_SLOTS = {slots: f"soak_app.slots_{slots}" for slots in (1, 2, 3)}

#: Leases short enough that a slot left behind by a failed release comes back soon.
LEASE = 5.0


def slots_of_key(key: int) -> int:
    """How many slots key ``key`` has (1, 2 or 3)."""
    return key % 3 + 1


def create_app(urls: AppUrls) -> Celery:
    """The soak app on ``urls``, its lock store on the server named by the environment."""
    urls = replace(urls, lock=os.environ.get(LOCK_URL_ENV, urls.lock))
    app = Celery("soak_app", broker=urls.broker, backend=urls.backend, set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
    )
    for slots, name in TASK_FOR_SLOTS.items():
        def body(self: Any, key: int, seconds: float) -> str:
            return fault_recorder(urls.record).work(self, [f"soak:{key}"], seconds)

        app.task(base=LimitedTask, bind=True, shared=False, name=name, lock_slots=slots,
                 lock_key="soak:{key}", lock_lease=LEASE, **FAST_RETRY)(body)
    return app


app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
