"""The Celery app of ``test_parking_rate_line.py``: :mod:`parking_app` (its tasks, records
and line setting) with tasks under a rate limit.

``rated``: 5 starts a second per key (burst 1), records as ``parking_app``'s tasks do
(``started`` is the server time of each body's start, µs; ``admitted`` the start its
lease counts from, ms: when it was admitted, or the start booked for it).
``rated_slots``: the same rate and one slot per key (a run under a rate and slots);
``rated_two_slots``: the same rate and two slots per key (records ``admitted`` too).
``rated_waits``: one start every 5 s per key (burst 0), for at most ``MAX_WAIT`` s of
waiting; ``rated_slots_waits``: the same and two slots per key (a mixed run).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask

from fault_app import fault_recorder
from parking_app import create_app as create_parking_app
from worker_app import BROKER_URL_ENV, AppUrls

RATED = "parking_rate_app.rated"
RATED_SLOTS = "parking_rate_app.rated_slots"
RATED_TWO_SLOTS = "parking_rate_app.rated_two_slots"
RATED_WAITS = "parking_rate_app.rated_waits"
RATED_SLOTS_WAITS = "parking_rate_app.rated_slots_waits"
SLOW_RATE = "1/5s"
MAX_WAIT = 1.0
RATED_PREFIX = "rated:"
RATE = "5/s"
BURST = 1


def create_app(urls: AppUrls) -> Celery:
    """``parking_app``'s app with the rated task."""
    app = create_parking_app(urls)

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED, lock_rate=RATE,
              lock_burst=BURST, lock_key=RATED_PREFIX + "{key}", lock_lease=4.0)
    def rated(self: Any, seconds: float, key: str = "a") -> str:
        """At most 5 starts a second per key."""
        recorder = fault_recorder(urls.record)
        lease = getattr(self.request, "redislock_lease", None)
        if lease is not None:  # the start the rate counted (admitted, or booked from)
            recorder.client.hset("admitted", self.request.id, lease.acquired_at_ms)
        return str(recorder.work(self, [RATED_PREFIX + key], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED_SLOTS, lock_rate=RATE,
              lock_burst=BURST, lock_slots=1, lock_key=RATED_PREFIX + "{key}",
              lock_lease=4.0)
    def rated_slots(self: Any, seconds: float, key: str = "a") -> str:
        """One at a time and at most 5 starts a second per key."""
        return str(fault_recorder(urls.record).work(self, [RATED_PREFIX + key], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED_TWO_SLOTS, lock_rate=RATE,
              lock_burst=BURST, lock_slots=2, lock_key=RATED_PREFIX + "{key}",
              lock_lease=4.0)
    def rated_two_slots(self: Any, seconds: float, key: str = "a") -> str:
        """Two at a time and at most 5 starts a second per key."""
        recorder = fault_recorder(urls.record)
        lease = getattr(self.request, "redislock_lease", None)
        if lease is not None:  # the start the rate counted
            recorder.client.hset("admitted", self.request.id, lease.acquired_at_ms)
        return str(recorder.work(self, [RATED_PREFIX + key], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED_WAITS, lock_rate=SLOW_RATE,
              lock_burst=0, lock_key=RATED_PREFIX + "{key}", lock_lease=4.0,
              lock_max_wait=MAX_WAIT)
    def rated_waits(self: Any, seconds: float, key: str = "a") -> str:
        """One start every 5 s per key, for at most MAX_WAIT s of waiting."""
        return str(fault_recorder(urls.record).work(self, [RATED_PREFIX + key], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED_SLOTS_WAITS,
              lock_rate=SLOW_RATE, lock_burst=0, lock_slots=2, lock_key=RATED_PREFIX + "{key}",
              lock_lease=4.0, lock_max_wait=MAX_WAIT)
    def rated_slots_waits(self: Any, seconds: float, key: str = "a") -> str:
        """The same under two slots per key too."""
        return str(fault_recorder(urls.record).work(self, [RATED_PREFIX + key], seconds))

    return app


#: The app of the worker processes (see :mod:`fault_app`).
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
