"""The Celery app that the real workers of ``test_fair_line.py`` run: :mod:`parking_app`
on the parking line (``redislock_line = "broker"``), with one more task whose global
cap is shared fairly across tenants (``fair_by``), recorded as ``parking_app``'s are
(``started`` / ``ended`` per task id, ``peaks:fair``)."""

from __future__ import annotations

import os
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask

from fault_app import fault_recorder
from parking_app import LEASE, LINE_ENV
from parking_app import create_app as create_parking_app
from worker_app import BROKER_URL_ENV, AppUrls

FAIR = "fair_app.fair"
PRIO = "fair_app.prio"
#: ``prio``: one at a time; 0.2 s of waiting worth one step of priority.
PRIO_AGING = 0.2
FAIR_SLOTS = 2
#: Two at a time over all tenants, the line served round-robin across tenants.
FAIR_LIMITS = [{"slots": FAIR_SLOTS, "key": "fair", "fair_by": "tenant:{tenant}",
                "lease": LEASE}]


def create_app(urls: AppUrls) -> Celery:
    """:func:`parking_app.create_app` on the parking line, with the ``fair`` task."""
    os.environ[LINE_ENV] = "broker"
    app = create_parking_app(urls)
    app.conf.redislock_limits = {**app.conf.redislock_limits, FAIR: FAIR_LIMITS}

    @app.task(base=LimitedTask, bind=True, shared=False, name=FAIR, lock_lease=LEASE)
    def fair(self: Any, seconds: float, tenant: str) -> str:
        """Two at a time over all tenants, round-robin across tenants."""
        return str(fault_recorder(urls.record).work(self, ["fair"], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=PRIO, lock_slots=1,
              lock_key="prio", lock_lease=LEASE, lock_priority_aging=PRIO_AGING)
    def prio(self: Any, seconds: float, tag: str) -> str:
        """One at a time; its message's priority orders its line (higher first)."""
        return str(fault_recorder(urls.record).work(self, ["prio"], seconds))

    return app


#: The app of the worker processes.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
