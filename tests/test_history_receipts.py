"""What the history check records of a delivery a worker's main process receives: the
``task_received`` signal hands it Celery's worker ``Request``, whose message headers are
in ``request_dict`` (it has no ``headers`` attribute), not a task's ``Context``."""

from __future__ import annotations

from typing import Any, Dict

from celery import Celery
from celery.worker.request import Request
from kombu import Message
from kombu.serialization import dumps

from history.app import is_copy, move_of_request


def _request(extra: Dict[str, Any]) -> Request:
    """A worker's ``Request`` for a message of task ``t.add`` with headers ``extra``."""
    app = Celery("receipts", set_as_current=False)

    @app.task(name="t.add", shared=False)
    def add() -> None:
        """Never run."""

    sent = app.amqp.as_task_v2("abc", "t.add", args=(), kwargs={})
    content_type, encoding, body = dumps(sent.body, serializer="json")
    message = Message(body=body, headers={**sent.headers, **extra}, content_type=content_type,
                      content_encoding=encoding, delivery_info={"redelivered": False},
                      properties=sent.properties)
    return Request(message, app=app)


def test_a_moved_copy_received_is_recorded_with_its_move_id() -> None:
    request = _request({"redislock_wait": {"park_id": "1:2", "move": "m1"}})
    assert move_of_request(request) == "m1"
    assert is_copy(request)


def test_the_message_a_task_was_sent_as_is_no_copy_and_has_no_move() -> None:
    request = _request({})
    assert move_of_request(request) == ""
    assert not is_copy(request)
