"""The lock store is never a way to run code: forged entries in a waiting line.

Runs that wait for a slot park a copy of their message in the semaphore's waiting line
(see ``handoff``). Anyone who can write to the lock store can put an entry there. A
forged entry must never be decoded with a serializer the app does not accept (pickle
above all), and with ``redislock_signing_key`` set an entry without a valid signature is
dropped, logged and counted, and never runs. A real redis-server and a real (in-process)
worker: the forged task would record its run in Redis from its body.
"""

from __future__ import annotations

import base64
import logging
import os
import pickle
import time

import pytest
from kombu.serialization import dumps

from celery_redislock import LimitedTask, Semaphore
from celery_redislock.engine.keys import companion_key, semaphore_key
from celery_redislock.integration import handoff
from celery_redislock.metrics import MemorySink, disable_metrics, enable_metrics

from support import BROKER_DB, FAST_RETRY, LOCK_DB, wait_until

# Messages parked in the lock store are the old "store" line's (the parking line keeps
# none there: tests/test_parking_line.py): pinned to it.
pytestmark = pytest.mark.celery(redislock_line="store")

PREFIX = "redislock:"
MARKER = "forged-ran"


class _WritesAFile:
    """Unpickling this creates the file ``path``: what a forged pickle entry would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _park(lock_client, name: str, ticket: str, message: str, since_ms: int = 1) -> str:
    """Put ``message`` in the waiting line of ``name`` as waiter ``ticket`` (first in line),
    as someone with write access to the lock store could; the line's hash key."""
    key = semaphore_key(name, PREFIX)
    lock_client.zadd(companion_key(key, "q"), {ticket: since_ms})
    waiters = companion_key(key, "w")
    lock_client.hset(waiters, mapping={ticket: "{}", f"m:{ticket}": message})
    lock_client.zadd(companion_key(key, "x"), {ticket: int(time.time() * 1000) + 600_000})
    return waiters


def _pickle_entry(path: str) -> str:
    body = base64.b64encode(pickle.dumps(_WritesAFile(path))).decode()
    return f"application/x-python-serialize\nbinary\nb64\n{body}"


def _json_entry(task_name: str, task_id: str) -> str:
    message = {"task": task_name, "args": [], "kwargs": {}, "options": {"task_id": task_id},
               "subtask_type": None, "immutable": False}
    content_type, encoding, body = dumps(message, serializer="json")
    return f"{content_type}\n{encoding}\ntext\n{body}"


@pytest.fixture(scope="session")
def celery_config(redis_server):
    """As the suite's, but the worker also accepts pickle (the tests' apps vary what
    their own ``accept_content`` says about the line)."""
    base = f"redis://127.0.0.1:{redis_server.port}"
    return {"broker_url": f"{base}/{BROKER_DB}", "result_backend": "cache+memory://",
            "redislock_url": f"{base}/{LOCK_DB}", "task_serializer": "json",
            "result_serializer": "json", "accept_content": ["json", "pickle"]}


@pytest.fixture
def recorded(celery_app, lock_client):
    """A task that records its runs in the lock store's database; and a run of a
    legitimate marker task, which the (solo, first-in first-out) worker runs after
    anything published before it."""

    @celery_app.task(name="trust.record", shared=False)
    def record(tag="forged"):
        lock_client.rpush(MARKER, tag)
        return tag

    return record


def _published_after_this_run(record) -> None:
    """Publish a legitimate run and wait for it: whatever was published before has run."""
    assert record.delay("marker").get(timeout=15) == "marker"


@pytest.mark.parametrize("accept", [["json"], ["json", "pickle"]])
def test_forged_pickle_entry_is_never_decoded(celery_app, celery_worker, lock_client,
                                              recorded, tmp_path, caplog, accept):
    """A pickle entry in the line is never unpickled: not when the app accepts only JSON,
    and not when it accepts pickle but the entry carries no signature."""
    celery_app.conf.accept_content = accept
    celery_app.conf.redislock_signing_key = "k" * 32
    path = str(tmp_path / "pwned")
    waiters = _park(lock_client, "trust-pickle", "evil.0001", _pickle_entry(path))
    with caplog.at_level(logging.ERROR):
        woken = handoff.wake_waiters(celery_app, semaphore_key("trust-pickle", PREFIX))
    assert not os.path.exists(path), "the forged pickle entry was unpickled"
    assert woken == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(waiters in r.getMessage() for r in errors), [r.getMessage() for r in errors]


def test_forged_pickle_entry_is_not_decoded_without_a_key(celery_app, celery_worker,
                                                          lock_client, tmp_path, caplog):
    """No signing key: the line is still never a way to unpickle, even if the app
    accepts pickle for its broker messages."""
    celery_app.conf.accept_content = ["json", "pickle"]
    path = str(tmp_path / "pwned")
    _park(lock_client, "trust-nokey", "evil.0002", _pickle_entry(path))
    with caplog.at_level(logging.ERROR):
        handoff.wake_waiters(celery_app, semaphore_key("trust-nokey", PREFIX))
    assert not os.path.exists(path)
    assert any(r.levelno >= logging.ERROR for r in caplog.records)


def test_forged_json_entry_never_runs(celery_app, celery_worker, lock_client, recorded,
                                      caplog):
    """With a signing key, a well-formed JSON entry naming a real task, but not signed
    with the key, is dropped: its task never runs."""
    celery_app.conf.redislock_signing_key = "k" * 32
    celery_worker.reload()
    sink = MemorySink()
    enable_metrics(celery_app, sink=sink)
    waiters = _park(lock_client, "trust-json", "evil.0003",
                    _json_entry(recorded.name, "forged-id"))
    with caplog.at_level(logging.ERROR):
        woken = handoff.wake_waiters(celery_app, semaphore_key("trust-json", PREFIX))
    _published_after_this_run(recorded)
    assert lock_client.lrange(MARKER, 0, -1) == [b"marker"], "the forged run executed"
    assert woken == 0
    assert any(waiters in r.getMessage() and r.levelno >= logging.ERROR
               for r in caplog.records)
    assert sink.value("lock_store_errors_total", task="", kind="rejected_entry") == 1
    disable_metrics(celery_app)
    assert not lock_client.hexists(waiters, "m:evil.0003"), "the entry was left in the line"


def test_signed_entries_are_handed_over(celery_app, celery_worker, lock_client):
    """The key set on every worker: a real waiter's entry is signed, verified and handed
    over at once when its slot frees."""
    celery_app.conf.redislock_signing_key = "k" * 32
    ran = []

    @celery_app.task(base=LimitedTask, lock_key="trust-signed", shared=False,
                     lock_retry_backoff=30, lock_retry_backoff_max=30)
    def waiter():
        ran.append(1)
        return "ran"

    celery_worker.reload()
    blocker = Semaphore(lock_client, "trust-signed", slots=1, lease=30)
    held = blocker.acquire(blocking=False)
    result = waiter.delay()
    line = companion_key(semaphore_key("trust-signed", PREFIX), "q")
    wait_until(lambda: lock_client.zcard(line) == 1, what="the run to join the line")
    parked = [v for f, v in lock_client.hgetall(companion_key(line, "w")).items()
              if f.startswith(b"m:")]
    assert parked and parked[0].startswith(b"hmac-sha256:")
    blocker.release(held)
    assert handoff.wake_waiters(celery_app, semaphore_key("trust-signed", PREFIX)) == 1
    # a 30 s countdown: only the express copy can run it this soon
    assert result.get(timeout=10) == "ran"


def test_pickle_task_parks_no_pickle_without_a_key(celery_app, celery_worker, lock_client):
    """A task serialized with pickle, no signing key: what it parks in the line is not
    pickle, and it is still handed its slot."""
    celery_app.conf.accept_content = ["json", "pickle"]

    @celery_app.task(base=LimitedTask, lock_key="trust-pickle-task", shared=False,
                     serializer="pickle", **FAST_RETRY)
    def pickled(value):
        return value

    celery_worker.reload()
    blocker = Semaphore(lock_client, "trust-pickle-task", slots=1, lease=30)
    held = blocker.acquire(blocking=False)
    result = pickled.delay(5)
    line = companion_key(semaphore_key("trust-pickle-task", PREFIX), "q")
    wait_until(lambda: lock_client.zcard(line) == 1, what="the run to join the line")
    parked = [v for f, v in lock_client.hgetall(companion_key(line, "w")).items()
              if f.startswith(b"m:")]
    assert parked and b"python-serialize" not in parked[0]
    blocker.release(held)
    assert result.get(timeout=15) == 5
