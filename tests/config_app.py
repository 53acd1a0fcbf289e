"""A Celery app whose limits come only from the ``redislock_limits`` setting.

Its tasks are plain ``@app.task`` functions with no package code in them; the workers run
it with ``celery -A config_app worker``. The task bodies record their runs like
:mod:`worker_app`'s (same record store layout).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from celery import Celery

import celery_redislock
from celery_redislock.integration import signals

from worker_app import BROKER_URL_ENV, AppUrls, recorder

SEND_EMAIL = "config_app.send_email"
CALL_API = "config_app.call_api"
CHARGE = "config_app.charge"

#: The configured rate of ``call_api`` per token, and of ``charge`` overall.
API_RATE_PER_SECOND = 20
CHARGE_RATE_PER_SECOND = 10

FAST_RETRY = {"retry_backoff": 0.05, "retry_backoff_max": 0.3}

LIMITS = {
    "config_app.send_*": {"slots": 2, **FAST_RETRY},
    CALL_API: {"rate": f"{API_RATE_PER_SECOND}/s", "key": "token:{api_token}"},
    CHARGE: [
        {"slots": 1, "key": "merchant:{merchant_id}", **FAST_RETRY},
        {"rate": f"{CHARGE_RATE_PER_SECOND}/s"},
    ],
}


def create_app(urls: AppUrls) -> Celery:
    """The app on ``urls``: three plain tasks, limited by :data:`LIMITS` through install()."""
    app = Celery("config_app", broker=urls.broker, backend=urls.backend, set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        redislock_limits=LIMITS,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
    )

    @app.task(bind=True, shared=False, name=SEND_EMAIL)
    def send_email(self: Any, n: int, seconds: float = 0.15) -> int:
        recorder(urls.record).run(self.request.id, ["email"], seconds)
        return n

    @app.task(bind=True, shared=False, name=CALL_API)
    def call_api(self: Any, api_token: str) -> str:
        record_admission(self)
        recorder(urls.record).run(self.request.id, [f"token:{api_token}"], 0)
        return api_token

    @app.task(bind=True, shared=False, name=CHARGE)
    def charge(self: Any, merchant_id: int, amount: int, seconds: float = 0.15) -> int:
        record_admission(self)
        recorder(urls.record).run(self.request.id, [f"merchant:{merchant_id}", "charge"],
                                  seconds)
        return amount

    def record_admission(task: Any) -> None:
        """When the limits admitted this run (server clock, ms): what rates are about."""
        lease = task.request.redislock_lease
        recorder(urls.record).client.hset("admitted", task.request.id, lease.acquired_at_ms)

    def record_promise(sender: Any = None, task_id: Optional[str] = None,
                       promise: Optional[int] = None, **_: Any) -> None:
        """Every start a rate limit promised a run it sent back to the queue (server
        clock, µs), in ``promised:<task id>``."""
        if getattr(sender, "app", None) is app:
            recorder(urls.record).client.rpush(f"promised:{task_id}", promise)

    signals.rate_limited.connect(record_promise, weak=False)

    celery_redislock.install(app)
    return app


app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
