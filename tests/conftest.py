"""Shared fixtures: private redis-server processes, never the machine's shared Redis."""

from __future__ import annotations

import pytest

# pytest-celery 1.x replaces the classic in-process ``celery_worker`` fixture with one that
# needs a Docker engine; bring the classic one (celery.contrib.pytest) back for our tests.
from celery.contrib.pytest import celery_worker  # noqa: F401
from redis_process import RedisServer


@pytest.fixture(scope="session")
def redis_server():
    """One redis-server for the whole session (tests use distinct keys, or flush)."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_client(redis_server):
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def own_redis_server():
    """A redis-server of this test's own, which it may stop, restart or flush."""
    server = RedisServer().start()
    yield server
    server.cleanup()
