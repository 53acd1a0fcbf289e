"""Shared fixtures: private redis-server processes, never the machine's shared Redis."""

from __future__ import annotations

import pytest

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
