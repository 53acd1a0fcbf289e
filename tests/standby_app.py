"""The Celery app that the real workers of ``test_standby_worker.py`` run: :mod:`fair_app`
(the parking line, the ``fair`` task: two slots over all tenants, round-robin across
tenants) with ``redislock_standby`` on and the async gate.

Test-only hook, read at import: ``REDISLOCK_TEST_KILL_ON_STANDBY=<node>``: the first time
worker ``<node>`` holds a standby, it records the standby's task id (``standby-killed``
in the record store, once for the cluster) and SIGKILLs its whole process group. Each
worker's main process also records which worker's pool accepted each run (``ACCEPTED``).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Optional

from celery import Celery
from celery.worker.request import Request

from celery_redislock.gate import standby

from fair_app import create_app as create_fair_app
from fault_app import fault_recorder
from parking_app import GATE_ENV
from worker_app import BROKER_URL_ENV, AppUrls

KILL_ENV = "REDISLOCK_TEST_KILL_ON_STANDBY"
KILLED = "standby-killed"
#: The record store's list of the task ids each worker held as a standby.
HELD = "standby-held"
#: The record store's hash: task id -> the worker whose pool process accepted it (then
#: Celery's default acks acknowledge its message, before its body starts).
ACCEPTED = "accepted"


def create_app(urls: AppUrls) -> Celery:
    """:func:`fair_app.create_app` with standbys on the async gate."""
    os.environ[GATE_ENV] = "async"
    app = create_fair_app(urls)
    app.conf.redislock_standby = True
    _record_standbys(urls)
    return app


def _record_standbys(urls: AppUrls) -> None:
    """Record each standby held (``HELD``), and the hook of ``KILL_ENV``."""
    node = os.environ.get(KILL_ENV)
    hold_here = standby.hold_here

    def held(consumer: Any, request: Any, *args: Any, **kwargs: Any) -> bool:
        kept = hold_here(consumer, request, *args, **kwargs)
        if kept:
            client = fault_recorder(urls.record).client
            client.rpush(HELD, request.id)
            name = str(getattr(consumer, "hostname", "") or "").split("@", 1)[0]
            if node and name == node and client.setnx(KILLED, request.id):
                os.killpg(os.getpgid(0), signal.SIGKILL)
        return kept

    standby.hold_here = held  # type: ignore[assignment]
    accepted = Request.on_accepted

    def on_accepted(self: Any, pid: Any, time_accepted: Any) -> None:
        fault_recorder(urls.record).client.hset(ACCEPTED, self.id, self.hostname or "")
        accepted(self, pid, time_accepted)

    Request.on_accepted = on_accepted  # type: ignore[method-assign]


#: The app of the worker processes.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
