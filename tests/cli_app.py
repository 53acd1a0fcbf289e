"""Celery apps for the ``celery -A cli_app redislock ...`` tests (``test_cli.py``,
``test_control.py``).

* :func:`create_app`: a tiny app whose lock store URL comes from the environment
  variable :data:`URL_ENV`, so a test can run the real ``celery`` command against the
  session's private redis-server.
* :func:`create_worker_app`: the app real worker processes run (``celery -A cli_app
  worker``, started by :class:`worker_cluster.WorkerCluster`, which sets the
  ``REDISLOCK_TEST_*_URL`` variables). Its task :data:`CALL_API` (and
  :data:`CALL_API_PATIENT`, which waits longer when refused) takes one slot per API
  token; it records in the record store when its body starts (``started`` hash: task id
  -> server time in µs) and, when asked to, holds its slot until the test sets
  ``go:<token>``; every refusal is recorded in the list ``refused:<task id>``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis
from celery import Celery

from celery_redislock import LimitedTask
from celery_redislock.admin.control import pause_key_of
from celery_redislock.integration.signals import lock_contended

from worker_app import BROKER_URL_ENV, FAST_RETRY, AppUrls, line_from_environment

URL_ENV = "CLI_APP_REDISLOCK_URL"
CRAWL = "cli_app.crawl"
CALL_API = "cli_app.call_api"
CALL_API_PATIENT = "cli_app.call_api_patient"

#: Countdowns of :data:`CALL_API_PATIENT` when refused (seconds, drawn in [10, 20]).
PATIENT = {"lock_retry_backoff": 20.0, "lock_retry_backoff_max": 20.0}

#: How long a held body waits for its ``go:<token>`` at most (seconds).
HOLD_LIMIT = 60.0


def create_app(url: str) -> Celery:
    """An app with its lock store at ``url`` and one task limited to two slots.

    Example::

        app = create_app("redis://127.0.0.1:6379/0")
        app.tasks[CRAWL].lock_slots   # 2
    """
    app = Celery("cli_app", set_as_current=False)
    app.conf.redislock_url = url

    @app.task(base=LimitedTask, lock_slots=2, name=CRAWL, shared=False)
    def crawl() -> None:
        return None

    return app


def api_name(token: str) -> str:
    """The limit name a :data:`CALL_API` run for ``token`` uses."""
    return f"api:{token}"


def create_worker_app(urls: AppUrls) -> Celery:
    """The app of the real workers, on ``urls``, with :data:`CALL_API`.

    Example::

        app = create_worker_app(AppUrls.on_server("redis://127.0.0.1:6390"))
        app.send_task(CALL_API, ("token-1",), {"hold": True})
    """
    app = Celery("cli_app", broker=urls.broker, backend=urls.backend, set_as_current=False)
    app.conf.update(redislock_url=urls.lock, broker_connection_retry_on_startup=True,
                    worker_prefetch_multiplier=1)
    line_from_environment(app)
    records: Optional[redis.Redis] = None

    def record_store() -> redis.Redis:
        nonlocal records
        if records is None:
            records = redis.Redis.from_url(urls.record, socket_timeout=10)
        return records

    def body(task: Any, token: str, hold: bool, retry_after: float) -> Any:
        store = record_store()
        seconds, micros = store.time()
        store.hset("started", task.request.id, seconds * 1_000_000 + micros)
        if retry_after:
            return pause_key_of(task, token, seconds=retry_after, keep_longer=True)
        deadline = time.monotonic() + HOLD_LIMIT
        while hold and not store.exists(f"go:{token}") and time.monotonic() < deadline:
            time.sleep(0.01)  # the simulated call, until the test lets it end
        return task.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=CALL_API, lock_slots=1,
              lock_key="api:{token}", **FAST_RETRY)
    def call_api(self: Any, token: str, hold: bool = False, retry_after: float = 0) -> Any:
        """One call at a time per token. ``hold``: keep the slot until ``go:<token>``.
        ``retry_after``: act on a 429 answer, pausing the token's key that long."""
        return body(self, token, hold, retry_after)

    @app.task(base=LimitedTask, bind=True, shared=False, name=CALL_API_PATIENT,
              lock_slots=1, lock_key="api:{token}", **PATIENT)
    def call_api_patient(self: Any, token: str, hold: bool = False) -> Any:
        """:data:`CALL_API`, whose refused runs come back only after 10-20 s on their own:
        one that starts sooner was handed a slot."""
        return body(self, token, hold, 0)

    def refused(sender: Any = None, task_id: Optional[str] = None,
                reason: Optional[str] = None, **_: Any) -> None:
        if sender is not None and sender.app is app:
            record_store().rpush(f"refused:{task_id}", reason or "")

    lock_contended.connect(refused, weak=False)
    return app


app = (create_worker_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ
       else create_app(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/0")))
