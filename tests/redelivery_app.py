"""A Celery app whose messages outlive the broker's visibility timeout, and which records
what Celery's own signals say about every run.

The workers run it with ``celery -A redelivery_app worker``. The broker's
``visibility_timeout`` is :data:`VISIBILITY_TIMEOUT` (one second) and the tasks acknowledge
late, so a body longer than that is delivered again while it runs (kombu's Redis transport
puts the unacknowledged message back at the front of the queue).

Besides the record store layout of :mod:`worker_app` (``runs:<id>``, ``started``, ...),
the workers count, per task id, in the record store:

``prerun``     hash: task id -> how many times ``task_prerun`` fired
``postrun``    hash: task id -> how many times ``task_postrun`` fired
``revoked``    hash: task id -> how many times ``task_revoked`` fired
``started-state``  hash: task id -> the task's state in the result backend, read by
               ``task_prerun`` just before the body (STARTED there is honest)
"""

from __future__ import annotations

import os
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask

from worker_app import BROKER_URL_ENV, AppUrls, count_signals, recorder

#: The broker's visibility timeout (seconds): shorter than the task bodies below.
VISIBILITY_TIMEOUT = 1

LIMITED = "redelivery_app.limited"
PLAIN = "redelivery_app.plain"
TRACKED = "redelivery_app.tracked"
KEY = "one-at-a-time"


def create_app(urls: AppUrls) -> Celery:
    """The app on ``urls``: one limited and one plain task, both acknowledged late."""
    app = Celery("redelivery_app", broker=urls.broker, backend=urls.backend,
                 set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": VISIBILITY_TIMEOUT,
            # kombu looks for unacknowledged messages every 10 x 10 s by default
            "unacked_restore_interval": 1, "unacked_restore_throttle": 1,
        },
        worker_prefetch_multiplier=1,
        task_acks_late=True,
    )

    @app.task(base=LimitedTask, bind=True, shared=False, name=LIMITED, lock_slots=1,
              lock_key=KEY, lock_retry_backoff=0.05, lock_retry_backoff_max=0.3)
    def limited(self: Any, seconds: float) -> str:
        """One at a time across the cluster; its body outlives the visibility timeout."""
        recorder(urls.record).run(self.request.id, [KEY], seconds)
        return self.request.id

    @app.task(bind=True, shared=False, name=PLAIN)
    def plain(self: Any, seconds: float) -> str:
        """The same body without the package: what Celery alone does with it."""
        recorder(urls.record).run(self.request.id, ["plain"], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=TRACKED, lock_slots=1,
              lock_key="tracked", lock_retry_backoff=0.05, lock_retry_backoff_max=0.3,
              track_started=True, acks_late=False)
    def tracked(self: Any, seconds: float) -> str:
        """One at a time, with STARTED stored; acknowledged on receipt."""
        recorder(urls.record).run(self.request.id, ["tracked"], seconds)
        return self.request.id

    count_signals(app, urls.record, lambda task: task.name == TRACKED, revoked=True)
    return app


app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
