"""The gate's task context of a worker request: what Celery's own ``request._context``
is, attribute for attribute, and kept as the request's own."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.mocks import TaskMessage
from celery.worker.request import Request

from celery_redislock.gate import task_context
from celery_redislock.gate.task_context import context_of


@pytest.fixture(scope="module")
def app() -> Any:
    app = Celery("task-context", set_as_current=False)

    @app.task(name="proj.work")
    def work(a: int, b: int = 0) -> int:
        return a + b

    return app


def message_of(**headers: Any) -> Any:
    message = TaskMessage("proj.work", id="run-1", args=(1,), kwargs={"b": 2},
                          timelimit=(10, 5), **headers)
    message.properties = {"correlation_id": "run-1", "reply_to": "r", "priority": 0}
    message.delivery_info = {"exchange": "", "routing_key": "q", "redelivered": False}
    return message


def request_of(app: Any, message: Any = None, **headers: Any) -> Request:
    return Request(message or message_of(**headers), app=app)


@pytest.mark.parametrize("headers", [
    {}, {"redislock_wait": {"attempts": 2, "since": 17}}, {"custom": "x", "other": [1]},
])
def test_the_context_is_celerys(app: Any, headers: Any) -> None:
    assert task_context.FAST  # this Celery's Context is made the same way
    message = message_of(**headers)
    ours, celerys = request_of(app, message), request_of(app, message)
    context = context_of(ours)
    assert vars(context) == vars(celerys._context)
    assert context.headers == (headers or None)
    assert ours._context is context  # kept for Celery to use
    assert context_of(ours) is context


def test_celerys_own_when_made_already_or_not_checked(app: Any, monkeypatch: Any) -> None:
    request = request_of(app)
    made = request._context
    assert context_of(request) is made
    monkeypatch.setattr(task_context, "FAST", False)
    other = request_of(app)
    assert context_of(other) is other._context


def test_revoked_is_celerys_answer(app: Any, monkeypatch: Any) -> None:
    """A request nothing revoked is answered without Celery's call; one revoked by id,
    expired, or already revoked gets Celery's own answer (which announces it)."""
    assert task_context.READS_REVOCATION  # this Celery has what it reads
    calls = []
    original = Request.revoked

    def counted(self: Any) -> bool:
        calls.append(self.id)
        return bool(original(self))

    monkeypatch.setattr(Request, "revoked", counted)
    monkeypatch.setattr(Request, "_announce_revoked", lambda *args, **kwargs: None)
    request = request_of(app)
    assert task_context.revoked(request) is False and calls == []
    with monkeypatch.context() as patched:
        patched.setattr(task_context, "READS_REVOCATION", False)
        assert task_context.revoked(request) is False and calls == ["run-1"]
    state = task_context.worker_state
    state.revoked.add("run-1")
    try:
        assert task_context.revoked(request_of(app)) is True and len(calls) == 2
        state.revoked.discard("run-1")
        expired = request_of(app, expires="2000-01-01T00:00:00+00:00")
        assert task_context.revoked(expired) is True and len(calls) == 3
    finally:
        state.revoked.discard("run-1")  # (an expired run's id is noted as revoked)
    request._already_revoked = True
    assert task_context.revoked(request) is True and len(calls) == 4
