"""Every way of giving back slots meets a failed call to the lock store in one place
(``pool.store_errors.not_given_back``): a warning that says whose slots and what becomes
of them; a fault that will not pass by itself (a refusal) is also sent as
``lock_store_error``, an outage is not. No process, no server: the releases fail by hand."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, List

import pytest
from redis.exceptions import ConnectionError, NoPermissionError

from celery_redislock.gate import recovery
from celery_redislock.pool import give_back
from celery_redislock.run import signals


class FailingLease:
    """A lease whose every release fails with ``error``."""

    name, token, lease_seconds, holds_slots = "crawl", "t0", 30.0, True

    def __init__(self, error: Exception) -> None:
        self.error = error

    def fail(self, *_: Any, **__: Any) -> None:
        raise self.error

    release = release_soon = release_handing_over = release_unreserved = fail


@pytest.fixture
def sent() -> Any:
    errors: List[dict] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        errors.append(kwargs)

    signals.lock_store_error.connect(receiver, weak=False)
    yield errors
    signals.lock_store_error.disconnect(receiver)


class Task:
    name = "t.crawl"


TASK = Task()


@pytest.mark.parametrize("eager", [False, True])
def test_a_refused_release_is_said_and_sent(caplog, sent, eager):
    lease: Any = FailingLease(NoPermissionError("no permissions to run 'evalsha'"))
    with caplog.at_level(logging.WARNING):
        give_back.give_back(TASK, lease, SimpleNamespace(id="r1", is_eager=eager), print)
    said = [record.getMessage() for record in caplog.records]
    assert any("could not give back the slots of 'crawl' held by task t.crawl[r1]" in line
               and "NOPERM" in line and "within 30 s" in line for line in said), said
    assert [(error["task_id"], error["key"], error["kind"]) for error in sent] == [
        ("r1", "crawl", "permission")]


def test_an_unreachable_store_is_said_not_sent(caplog, sent):
    lease: Any = FailingLease(ConnectionError("refused"))
    with caplog.at_level(logging.WARNING):
        give_back.give_back_exiting(TASK, lease, SimpleNamespace(id="r2"))
    said = [record.getMessage() for record in caplog.records]
    assert any("held by task t.crawl[r2]" in line and "once the process is gone" in line
               for line in said), said
    assert sent == []


def test_recovery_frees_through_the_same_path(caplog, sent):
    def broken() -> int:
        raise NoPermissionError("no permissions")

    with caplog.at_level(logging.INFO):
        recovery._free_saying(broken, "of t.crawl[r3] (WorkerLostError)")
        recovery._free_saying(lambda: 2, "of t.crawl[r4] (terminated)")
        recovery._free_saying(lambda: 0, "of t.crawl[r5] (terminated)")
    said = [record.getMessage() for record in caplog.records]
    assert any("could not give back the slots of t.crawl[r3] (WorkerLostError)" in line
               and "NOPERM" in line for line in said), said
    assert "celery-redislock: freed 2 slot(s) of t.crawl[r4] (terminated)" in said
    assert not any("r5" in line for line in said)
    assert sent == []  # a worker's frees name no run to count against
