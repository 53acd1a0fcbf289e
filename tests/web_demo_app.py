"""The Celery app behind the dashboard's screenshot (``web_screenshot.py``): a few limits
of the kinds operators see — a shared pool of slots, one slot per tenant with a rate, a
singleton — whose runs sleep a while, so that slots fill, runs wait and slots free.

Its workers run ``celery -A web_demo_app worker`` (started by
:class:`worker_cluster.WorkerCluster`, which sets the ``REDISLOCK_TEST_*_URL`` variables).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from celery import Celery

from celery_redislock import LimitedTask

from worker_app import BROKER_URL_ENV, AppUrls

RENDER = "reports.render_pdf"
SYNC = "crm.sync_account"
REBUILD = "search.rebuild_index"

#: Countdowns of refused runs: short, so the picture moves.
QUICK = {"lock_retry_backoff": 0.5, "lock_retry_backoff_max": 1.0}


def create_worker_app(urls: AppUrls) -> Celery:
    """The app on ``urls``.

    Example::

        app = create_worker_app(AppUrls.on_server("redis://127.0.0.1:6390"))
        app.send_task(RENDER, (3.0,))
    """
    app = Celery("web_demo_app", broker=urls.broker, backend=urls.backend,
                 set_as_current=False)
    app.conf.update(redislock_url=urls.lock, broker_connection_retry_on_startup=True,
                    worker_prefetch_multiplier=1, task_ignore_result=True)

    @app.task(base=LimitedTask, shared=False, name=RENDER, lock_slots=4, **QUICK)
    def render_pdf(seconds: float) -> None:
        """Four at once across the cluster."""
        time.sleep(seconds)

    @app.task(base=LimitedTask, shared=False, name=SYNC, lock_slots=2, lock_rate="30/m",
              lock_key="crm:{tenant}", **QUICK)
    def sync_account(tenant: str, seconds: float) -> None:
        """Two at once and 30 a minute per tenant."""
        time.sleep(seconds)

    @app.task(base=LimitedTask, shared=False, name=REBUILD, lock_slots=1, **QUICK)
    def rebuild_index(seconds: float) -> None:
        """One at a time."""
        time.sleep(seconds)

    return app


app: Optional[Celery] = (
    create_worker_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
