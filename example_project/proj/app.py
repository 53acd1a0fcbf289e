"""The Celery app, configured from environment variables.

=========================  ==================================================================
``PROJ_BROKER_URL``        Broker URL (required; there is deliberately no default, so the
                           project never talks to a Redis server nobody chose).
``PROJ_RESULT_BACKEND``    Result backend URL (default: the broker URL).
``PROJ_REDISLOCK_URL``     Redis URL of the semaphores (default: the broker URL).
``PROJ_RECORD_URL``        Redis URL where the tasks record their runs (default: the
                           semaphores' URL).
``PROJ_RECORD_PREFIX``     Start of the keys of those records (default ``"proj-demo:"``).
=========================  ==================================================================
"""

from __future__ import annotations

import os
from typing import Mapping

from celery import Celery


def required(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """The value of the environment variable ``name``, or a clear error if it is unset."""
    value = environ.get(name, "").strip()
    if not value:
        raise RuntimeError(f"set the environment variable {name} (a redis:// URL)")
    return value


def make_app(environ: Mapping[str, str] = os.environ) -> Celery:
    """Build the Celery app from the ``PROJ_*`` environment variables."""
    broker = required("PROJ_BROKER_URL", environ)
    app = Celery("proj", include=["proj.tasks"])
    app.conf.update(
        broker_url=broker,
        result_backend=environ.get("PROJ_RESULT_BACKEND") or broker,
        redislock_url=environ.get("PROJ_REDISLOCK_URL") or broker,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
    )
    return app


app = make_app()
