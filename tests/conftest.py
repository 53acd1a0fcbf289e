"""Shared fixtures: private redis-server processes, never the machine's shared Redis."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

# pytest-celery 1.x replaces the classic in-process ``celery_worker`` fixture with one that
# needs a Docker engine; bring the classic one (celery.contrib.pytest) back for our tests.
from celery.contrib.pytest import celery_worker  # noqa: F401
from celery.signals import task_prerun

from celery_redislock.engine.admission import declare_fresh
from celery_redislock.integration.signals import lock_contended, rate_limited

import redis_process
from history.events import Recorder
from redis_process import RedisServer
from support import BROKER_DB, LOCK_DB
from worker_app import AppUrls

#: The fixtures of real multi-worker clusters (``cluster``, ...), for every test module.
pytest_plugins = ["worker_cluster"]

#: The test files that take longest (measured: from about a minute and a half down to a
#: quarter of one, most of it waiting on real workers), longest first. The suite runs in
#: several processes, a file at a time to each (pyproject.toml: pytest-xdist's
#: ``--dist loadfile``, handed out in collection order): these go first, so that none of
#: them is left to run alone at the end while the other processes idle. The other files
#: follow in their usual order.
LONGEST_FIRST = (
    "test_gate.py", "test_faults.py", "test_parking_line.py", "test_namesakes.py",
    "test_workers.py", "test_store_loss.py", "test_celery_task.py", "test_config_workers.py",
    "test_redelivery.py", "test_engine_model.py", "test_metrics.py", "test_unique.py",
    "test_store_refusals.py", "test_cli_project.py", "test_quickstart.py",
    "test_rate_control.py", "test_demo.py", "test_period.py", "test_handoff_lock_store.py",
    "test_line_rates.py", "test_cli.py", "test_web.py",
)


def pytest_collection_modifyitems(items):
    """The longest files first (see :data:`LONGEST_FIRST`); each file's tests keep their
    order, and so do the other files."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    tests_directory = Path(__file__).resolve().parent
    items.sort(key=lambda item: rank.get(item.path.name, len(rank))
               if item.path.parent == tests_directory else len(rank))


@pytest.fixture(scope="session")
def redis_server(redislock_server):
    """One redis-server for the whole session: the package's pytest plugin's."""
    return redislock_server


@pytest.fixture
def history_urls(redis_server):
    """The history check's URLs on the session's redis-server, its record (database 3)
    emptied before and after the test."""
    urls = AppUrls.on_server(redis_server.url)
    recorder = Recorder(urls.record)
    recorder.client.delete("history")
    yield urls
    recorder.client.delete("history")


@pytest.fixture
def redis_client(redis_server):
    client = redis_server.client()
    client.flushall()
    declare_fresh(client)  # emptied on purpose: not a store that lost its data
    yield client
    client.close()


@pytest.fixture
def own_redis_server():
    """A redis-server of this test's own, which it may stop, restart or flush."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def closed_port():
    """A port of 127.0.0.1 that refuses connections for the whole test: held bound, so
    that no other test process's server can take it meanwhile."""
    with redis_process.closed_port() as port:
        yield port


@pytest.fixture(scope="session")
def celery_config(redis_server):
    """For pytest-celery's ``celery_app``: broker and lock store on the private server;
    results in this process's memory (the classic worker runs in a thread of this process)."""
    base = f"redis://127.0.0.1:{redis_server.port}"
    return {
        "broker_url": f"{base}/{BROKER_DB}",
        "result_backend": "cache+memory://",
        "redislock_url": f"{base}/{LOCK_DB}",
        "task_serializer": "json",
        "result_serializer": "json",
    }


@pytest.fixture
def lock_client(redis_server):
    """A client of the lock store database, emptied for each test."""
    client = redis_server.client(db=LOCK_DB)
    client.flushdb()
    declare_fresh(client)  # emptied on purpose: not a store that lost its data
    yield client
    client.close()


@pytest.fixture
def deliveries():
    """Counts, per task id, how many times a worker took up a run: ``task_prerun`` for
    a run that reached a pool process, ``lock_contended``/``rate_limited`` for one
    refused before it (a refusal inside a pool process counts twice: no matter here)."""
    seen: Counter = Counter()

    def count(task_id=None, **_):
        seen[task_id] += 1

    receivers = (task_prerun, lock_contended, rate_limited)
    for signal in receivers:
        signal.connect(count, weak=False)
    yield seen
    for signal in receivers:
        signal.disconnect(count)


@pytest.fixture(autouse=True)
def no_stale_event_loop():
    """After each test, forget kombu's global event loop, as kombu 5.6.1 and later do when
    a worker's loop closes (celery#9983): before that, the next in-process worker
    (``celery_worker``) took over the closed loop of the previous test's worker, whose
    timer nobody fires, so a countdown or ETA message never ran - every waiting run of
    a limited task was delivered once and never again."""
    yield
    from kombu.asynchronous import set_event_loop

    set_event_loop(None)

