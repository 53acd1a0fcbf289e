"""pytest fixtures for testing your own limited tasks against a real, throw-away Redis.

The plugin is registered when the package is installed. In a test::

    def test_sync_is_one_at_a_time(redislock_app):   # a Celery app whose lock store
        ...                                           # is a private redis-server

``redislock_server``  a :class:`~celery_redislock.testing.RedisServer` for the session
``redislock_url``     its URL, emptied before each test
``redislock_app``     pytest-celery's ``celery_app`` with ``redislock_url`` pointing at
                      the private server (needs pytest-celery: the ``pytest`` extra,
                      ``pip install 'celery-redislock[pytest]'``)

To switch limits off instead (unit tests that should not need Redis at all), set
``app.conf.redislock_enabled = False``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from . import RedisServer


@pytest.fixture(scope="session")
def redislock_server() -> Iterator[RedisServer]:
    """A private redis-server for the whole test session."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def redislock_url(redislock_server: RedisServer) -> str:
    """The URL of the private server, emptied for this test, and said to be emptied on
    purpose: an app that used it in an earlier test must not take the empty store for one
    that lost its data and wait out a grace (what
    :func:`celery_redislock.engine.admission.declare_fresh` does, for the default prefix;
    this layer does not import the engine)."""
    client = redislock_server.client()
    client.flushall()
    seconds, micros = client.time()
    client.hset("redislock:incarnation",
                mapping={"born": seconds * 1_000_000 + micros, "grace": 0, "keep": 0})
    client.pexpire("redislock:incarnation", 7 * 24 * 3600 * 1000)
    return redislock_server.url


@pytest.fixture
def redislock_app(request: pytest.FixtureRequest, redislock_url: str) -> Any:
    """pytest-celery's ``celery_app``, with its lock store on the private server.

    It needs pytest-celery (``pip install 'celery-redislock[pytest]'``).
    """
    try:
        app = request.getfixturevalue("celery_app")
    except pytest.FixtureLookupError:
        app = None
    if app is None:
        pytest.fail("the redislock_app fixture needs pytest-celery's celery_app fixture: "
                    "pip install 'celery-redislock[pytest]'", pytrace=False)
    app.conf.redislock_url = redislock_url
    return app
