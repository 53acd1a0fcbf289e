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
from celery.signals import task_postrun, task_prerun, task_revoked

from celery_redislock import LimitedTask

from worker_app import BROKER_URL_ENV, AppUrls, recorder

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

    def count(name: str, task_id: Optional[str]) -> None:
        if task_id:
            recorder(urls.record).client.hincrby(name, task_id, 1)

    # The handlers are connected for the whole process, which outlives this app in a
    # test process: they count runs of this app's tasks only (another app's embedded
    # worker must not call a record store that is gone).
    def ours(task: Any) -> bool:
        return getattr(task, "app", None) is app

    @task_prerun.connect(weak=False)
    def on_prerun(task_id: Optional[str] = None, task: Any = None, **_: Any) -> None:
        if not ours(task):
            return
        count("prerun", task_id)
        if task is not None and task.name == TRACKED and task_id:
            state = task.AsyncResult(task_id).state
            recorder(urls.record).client.hset("prerun-state", task_id, state)

    @task_postrun.connect(weak=False)
    def on_postrun(task_id: Optional[str] = None, task: Any = None, **_: Any) -> None:
        if ours(task):
            count("postrun", task_id)

    @task_revoked.connect(weak=False)
    def on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
        if ours(sender):
            count("revoked", getattr(request, "id", None))

    return app


app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
