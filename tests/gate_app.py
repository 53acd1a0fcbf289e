"""A Celery app whose limited runs wait in every way a worker can meet them, and which
records what Celery's own signals say of every run: the app of ``test_gate.py``.

The workers run it with ``celery -A gate_app worker``; each prefetches four messages per
pool process (Celery's default), so a worker holds more runs than it has processes.
Every task stores STARTED (``track_started``) and sends task events.

Besides the record store layout of :mod:`worker_app` (``runs:<id>``, ``started``, ...),
the workers count, per task id, in the record store:

``prerun``        hash: task id -> how many times ``task_prerun`` fired
``postrun``       hash: task id -> how many times ``task_postrun`` fired
``prerun-state``  hash: task id -> the task's state in the result backend, read by
                  ``task_prerun`` just before the body: PENDING unless an earlier pass
                  through a pool process stored STARTED for it
"""

from __future__ import annotations

import os
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask

from worker_app import BROKER_URL_ENV, AppUrls, count_signals, line_from_environment, recorder

SLOTTED = "gate_app.slotted"
RATED = "gate_app.rated"
PLAIN = "gate_app.plain"
SLOTTED_KEY = "gate-slotted"
#: A task of THREE slots (more than a worker's two processes, fewer than two workers').
THREE = "gate_app.three"
THREE_KEY = "gate-three"
RATED_KEY = "gate-rated"
#: A task of FOUR slots whose body records the holder token it runs under (``tokens``:
#: task id -> token): a slot handed on in the worker (see
#: :mod:`celery_redislock.gate.hand_on`) names the run it was first taken for.
HANDED = "gate_app.handed"
HANDED_KEY = "gate-handed"
#: The lease of HANDED (seconds): a slot is handed on within a sixth of it (and 0.5 s).
HANDED_LEASE = 3
#: The rate of RATED: starts per second (burst 1).
RATE = 4
#: The lease of SLOTTED (seconds).
LEASE = 2
#: Set to ``1`` in a worker's environment: ``redislock_admit_before_pool = False``.
POOL_ASKS_ENV = "GATE_APP_POOL_ASKS"
#: A worker's ``redislock_gate`` (default ``"blocking"``).
GATE_ENV = "GATE_APP_GATE"


def create_app(urls: AppUrls) -> Celery:
    """The app on ``urls``: one slot-limited task, one rate-limited task, one plain task."""
    app = Celery("gate_app", broker=urls.broker, backend=urls.backend, set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        task_track_started=True,
        worker_send_task_events=True,
        redislock_admit_before_pool=os.environ.get(POOL_ASKS_ENV) != "1",
        redislock_gate=os.environ.get(GATE_ENV, "blocking"),
    )
    line_from_environment(app)

    @app.task(base=LimitedTask, bind=True, shared=False, name=SLOTTED, lock_slots=1,
              lock_key=SLOTTED_KEY, lock_lease=LEASE, lock_retry_backoff=0.05,
              lock_retry_backoff_max=0.3)
    def slotted(self: Any, seconds: float) -> str:
        """One at a time across the cluster; a slot whose admission's answer was lost
        comes back within LEASE seconds."""
        recorder(urls.record).run(self.request.id, [SLOTTED_KEY], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=THREE, lock_slots=3,
              lock_key=THREE_KEY, lock_lease=LEASE, lock_retry_backoff=0.05,
              lock_retry_backoff_max=0.3)
    def three(self: Any, seconds: float) -> str:
        """Three at a time across the cluster."""
        recorder(urls.record).run(self.request.id, [THREE_KEY], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=HANDED, lock_slots=4,
              lock_key=HANDED_KEY, lock_lease=HANDED_LEASE)
    def handed(self: Any, seconds: float, hold_if_handed: bool = False) -> str:
        """Four at a time across the cluster, recorded under its key and its holder
        token; with ``hold_if_handed``, a run handed a slot in its worker says so
        (``holding``) and holds it for a minute."""
        token = self.request.redislock_lease.token
        record = recorder(urls.record)
        record.client.hset("tokens", self.request.id, token)
        if hold_if_handed and f"|{self.request.id}|" not in token:
            record.client.set("holding", self.request.id)
            seconds = 60
        record.run(self.request.id, [HANDED_KEY, token], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=RATED,
              lock_rate=f"{RATE}/s", lock_key=RATED_KEY)
    def rated(self: Any, seconds: float) -> str:
        """RATE starts a second across the cluster, no slot limit."""
        recorder(urls.record).run(self.request.id, [RATED_KEY], seconds)
        return self.request.id

    @app.task(bind=True, shared=False, name=PLAIN)
    def plain(self: Any, seconds: float) -> str:
        """No limit: keeps a pool process busy."""
        recorder(urls.record).run(self.request.id, ["plain"], seconds)
        return self.request.id

    count_signals(app, urls.record)
    return app


app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
