""":mod:`worker_app` with RabbitMQ as the broker and Redis as lock store and result backend:
the most common production shape. The workers run it with ``celery -A rabbit_app worker``.

Each cluster gets a queue of its own (named after its private Redis server's port), so
tests never see each other's messages on the shared RabbitMQ.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Optional

from celery import Celery

import worker_app
from worker_app import BROKER_URL_ENV, AppUrls

AMQP_URL = os.environ.get("REDISLOCK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def queue_name(urls: AppUrls) -> str:
    """The queue of the cluster whose lock store is ``urls.lock``."""
    port = urls.lock.rsplit(":", 1)[1].split("/", 1)[0]
    return f"redislock-test-{port}"


def create_app(urls: AppUrls) -> Celery:
    """:func:`worker_app.create_app` on RabbitMQ, with a queue of this cluster's own."""
    app = worker_app.create_app(replace(urls, broker=AMQP_URL))
    app.conf.task_default_queue = queue_name(urls)
    return app


app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
