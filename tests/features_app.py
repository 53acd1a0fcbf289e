"""The Celery app of the end-to-end tests of unique tasks, run-time rates and periods.

Workers start it with ``celery -A features_app worker``; URLs come from the environment as
for :mod:`worker_app`, whose :class:`~worker_app.Recorder` the bodies use (``runs:<id>``,
``started``, ``peaks:<key>``, ...). A body also writes ``host:<task id>``, the node name
of the worker that ran it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from celery import Celery

import celery_redislock
from celery_redislock import LimitedTask, SingletonTask

from worker_app import BROKER_URL_ENV, AppUrls, line_from_environment, recorder

UNIQUE_SLEEP = "features_app.unique_sleep"
UNIQUE_RAISE = "features_app.unique_raise"
UNIQUE_RETRY = "features_app.unique_retry"
UNIQUE_SINGLETON = "features_app.unique_singleton"
PLAIN_UNIQUE = "features_app.plain_unique"
PLAIN_UNIQUE_LIMITED = "features_app.plain_unique_limited"
RATED = "features_app.rated"
RATED_KEY = "rated"
PERIODIC_DROP = "features_app.periodic_drop"
PERIODIC_DEFER = "features_app.periodic_defer"
UNIQUE_PERIOD = "features_app.unique_period"
WEIGHTED = "features_app.weighted"
WEIGHTED_KEY = "weighted"
WEIGHTED_SLOTS = "features_app.weighted_slots"
WEIGHTED_SLOTS_KEY = "weighted-slots"

#: Small countdowns when every slot is taken, so that the tests run fast.
FAST_RETRY = {"lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.3}


def _run(task: Any, key: str, seconds: float) -> str:
    record = recorder(task.app.conf.features_record_url)
    record.client.set(f"host:{task.request.id}", task.request.hostname or "")
    record.run(task.request.id, [key], seconds)
    return task.request.id


def slots_of(cost: int) -> int:
    """``lock_cost`` of :data:`WEIGHTED_SLOTS`: the run's own ``cost`` argument."""
    return cost


def create_app(urls: AppUrls) -> Celery:
    """A Celery app on ``urls`` with the feature tests' tasks registered."""
    app = Celery("features_app", broker=urls.broker, backend=urls.backend,
                 set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        features_record_url=urls.record,
        redislock_limits={
            PLAIN_UNIQUE: {"unique": True, "key": "job:{job}"},
            PLAIN_UNIQUE_LIMITED: [{"slots": 1, "key": "unique-limited"},
                                   {"unique": True, "key": "job:{job}"}],
            PERIODIC_DROP: {"period": "3s", "key": "drop:{job}"},
        },
    )
    line_from_environment(app)

    @app.task(base=LimitedTask, bind=True, shared=False, name=UNIQUE_SLEEP, lock_unique=True,
              lock_slots=5, lock_key="job:{job}", lock_lease=2, **FAST_RETRY)
    def unique_sleep(self: Any, job: str, seconds: float = 0.2) -> str:
        """Unique per job while queued or running; the lock's run lease is 2 s."""
        return _run(self, f"job:{job}", seconds)

    @app.task(base=LimitedTask, bind=True, shared=False, name=UNIQUE_RAISE,
              lock_unique="raise", lock_slots=5, lock_key="job:{job}", **FAST_RETRY)
    def unique_raise(self: Any, job: str, seconds: float = 0.2) -> str:
        """A second send of a queued or running job raises AlreadyQueued."""
        return _run(self, f"raise:{job}", seconds)

    @app.task(base=LimitedTask, bind=True, shared=False, name=UNIQUE_RETRY, lock_unique=True,
              lock_slots=5, lock_key="retry:{job}", max_retries=3, **FAST_RETRY)
    def unique_retry(self: Any, job: str, seconds: float = 0.1) -> int:
        """Retries itself once (its re-send must not be refused by its own lock)."""
        record = recorder(self.app.conf.features_record_url)
        record.client.incr(f"attempts:{self.request.id}")
        if self.request.retries == 0:
            raise self.retry(countdown=1.0)
        record.run(self.request.id, [f"retry:{job}"], seconds)
        return self.request.retries

    @app.task(base=SingletonTask, bind=True, shared=False, name=UNIQUE_SINGLETON,
              lock_unique=True, **FAST_RETRY)
    def unique_singleton(self: Any, seconds: float = 0.2) -> str:
        return _run(self, "singleton", seconds)

    @app.task(bind=True, shared=False, name=PLAIN_UNIQUE)
    def plain_unique(self: Any, job: str, seconds: float = 0.2) -> str:
        """A plain task made unique per job by the redislock_limits setting."""
        return _run(self, f"plain:{job}", seconds)

    @app.task(bind=True, shared=False, name=PLAIN_UNIQUE_LIMITED)
    def plain_unique_limited(self: Any, job: str, seconds: float = 0.2) -> str:
        """Unique per job while queued; one run at a time of any job while running."""
        record = recorder(self.app.conf.features_record_url)
        record.run(self.request.id, [f"ul:{job}", "unique-limited"], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED, lock_rate="20/s",
              lock_burst=0, lock_key=RATED_KEY, ignore_result=True)
    def rated(self: Any) -> None:
        """20/s, no burst; records when its limit admitted it (server ms) in
        ``admitted``."""
        recorder(self.app.conf.features_record_url).client.hset(
            "admitted", self.request.id, self.request.redislock_lease.acquired_at_ms)
        _run(self, RATED_KEY, 0)

    @app.task(bind=True, shared=False, name=PERIODIC_DROP)
    def periodic_drop(self: Any, job: str) -> str:
        """At most once per 3 s per job; later runs within the period are dropped."""
        return _run(self, f"drop:{job}", 0)

    @app.task(base=LimitedTask, bind=True, shared=False, name=PERIODIC_DEFER,
              lock_period="2s", lock_period_mode="defer", lock_key="defer:{job}",
              lock_slots=5)
    def periodic_defer(self: Any, job: str) -> str:
        """At most once per 2 s per job; later runs wait for the end of the period."""
        return _run(self, f"defer:{job}", 0)

    @app.task(base=LimitedTask, bind=True, shared=False, name=UNIQUE_PERIOD, lock_unique=True,
              lock_period="60s", lock_key="up:{job}", lock_slots=5)
    def unique_period(self: Any, job: str) -> str:
        """Unique while queued or running, and at most once a minute per job."""
        return _run(self, f"up:{job}", 0)

    @app.task(base=LimitedTask, bind=True, shared=False, name=WEIGHTED, lock_rate="10/s",
              lock_burst=1, lock_cost=2, lock_key=WEIGHTED_KEY, ignore_result=True)
    def weighted(self: Any) -> None:
        """Each run uses 2 starts of 10/s: 5 runs a second, 200 ms apart; records when its
        limit admitted it (server ms) in ``admitted``, as ``rated`` does."""
        recorder(self.app.conf.features_record_url).client.hset(
            "admitted", self.request.id, self.request.redislock_lease.acquired_at_ms)
        _run(self, WEIGHTED_KEY, 0)

    @app.task(base=LimitedTask, bind=True, shared=False, name=WEIGHTED_SLOTS, lock_slots=4,
              lock_cost=slots_of, lock_key=WEIGHTED_SLOTS_KEY, **FAST_RETRY)
    def weighted_slots(self: Any, cost: int, seconds: float = 0.15) -> str:
        """Takes ``cost`` of 4 slots. Records the sum of the costs of the bodies running
        as it starts (``weights``) and how often it ran (``runs:<id>``)."""
        record = recorder(self.app.conf.features_record_url).client
        record.incr(f"runs:{self.request.id}")
        record.rpush("weights", record.incrby("running-weight", cost))
        try:
            time.sleep(seconds)  # the simulated work of the task body
        finally:
            record.decrby("running-weight", cost)
        return self.request.id

    celery_redislock.install(app)
    return app


#: The app of the worker processes, which find the URLs in their environment.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
