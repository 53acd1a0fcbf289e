"""The Celery app of ``test_parking_broker``'s real worker: one task that records each
run's delivery and retries itself once (``self.retry``), to show a run moved back from a
parking queue retries to its original queue. Routed through a direct exchange to a
queue of another name, so that a retry that lost its route would be seen."""

from __future__ import annotations

import json
import os
from typing import Any

import kombu
import redis
from celery import Celery

from celery_redislock.parking import moved_copy

QUEUE = os.environ.get("PARKING_QUEUE", "parking-reports")
EXCHANGE = kombu.Exchange(QUEUE + "-exchange", type="direct")
ROUTING_KEY = "report.daily"


def create_app(broker: str, queue: str = QUEUE) -> Celery:
    exchange = kombu.Exchange(queue + "-exchange", type="direct")
    app = Celery("parking_broker_app", broker=broker, set_as_current=False)
    app.conf.update(
        task_queues=[kombu.Queue(queue, exchange, routing_key=ROUTING_KEY)],
        task_routes={"parking.retry_once": {"exchange": exchange.name,
                                            "routing_key": ROUTING_KEY}},
        task_default_queue=queue, task_ignore_result=True,
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
    app.task(name="parking.retry_once", bind=True, max_retries=3)(retry_once)
    return app


def retry_once(self: Any, record_url: str) -> None:
    request = self.request
    headers = request.headers if isinstance(request.headers, dict) else {}
    client = redis.Redis.from_url(record_url)
    client.rpush("runs", json.dumps({
        "retries": request.retries, "id": request.id,
        "exchange": request.delivery_info.get("exchange"),
        "routing_key": request.delivery_info.get("routing_key"),
        "wait": headers.get("redislock_wait"),
        "moved_copy": moved_copy(headers, request.retries)}))
    client.close()
    if request.retries == 0:
        raise self.retry(countdown=0)


app = create_app(os.environ["PARKING_BROKER_URL"]) if "PARKING_BROKER_URL" in os.environ \
    else None
