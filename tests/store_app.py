"""A Celery app for the lock store start checks (``test_store_refusals.py``).

Real ``celery -A store_app worker`` processes run it; its broker and lock store come
from the environment (:data:`BROKER_ENV`, :data:`LOCK_ENV`), and
:data:`REQUIRE_NOEVICTION_ENV` set to ``1`` turns ``redislock_require_noeviction`` on.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_redislock import LimitedTask

BROKER_ENV = "STORE_APP_BROKER_URL"
LOCK_ENV = "STORE_APP_LOCK_URL"
REQUIRE_NOEVICTION_ENV = "STORE_APP_REQUIRE_NOEVICTION"

app = Celery("store_app", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get(BROKER_ENV, "memory://"),
    redislock_url=os.environ.get(LOCK_ENV, "redis://127.0.0.1:1/0"),
    redislock_require_noeviction=os.environ.get(REQUIRE_NOEVICTION_ENV) == "1",
    broker_connection_retry_on_startup=True,
)


@app.task(base=LimitedTask, lock_slots=1, name="store_app.limited", shared=False)
def limited() -> str:
    return "ran"
