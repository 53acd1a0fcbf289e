"""The package's pytest plugin: a throw-away real Redis for users' integration tests."""

from __future__ import annotations

import redis

from celery_redislock import LimitedTask, Semaphore

from support import INCARNATION

pytest_plugins = ["pytester"]


def test_redislock_url_is_a_private_empty_server(redislock_url):
    client = redis.Redis.from_url(redislock_url)
    assert client.keys("*") == [INCARNATION]  # emptied, and said to be on purpose
    assert client.connection_pool.connection_kwargs["port"] != 6379
    assert Semaphore(client, "plugin").acquire(blocking=False) is not None


def test_redislock_app_runs_limited_tasks(redislock_app, redislock_url):
    @redislock_app.task(base=LimitedTask, lock_key="plugin-task", bind=True, shared=False)
    def limited(self):
        return self.request.redislock_lease.name

    assert limited.apply().get() == "plugin-task"
    assert Semaphore(redis.Redis.from_url(redislock_url), "plugin-task").holders() == 0


def test_the_pytest_extra_brings_pytest_celery():
    """redislock_app is pytest-celery's celery_app: the `pytest` extra declares it."""
    from importlib.metadata import metadata

    meta = metadata("celery-redislock")
    assert "pytest" in meta.get_all("Provides-Extra")
    assert any(requirement.startswith("pytest-celery") and 'extra == "pytest"' in requirement
               for requirement in meta.get_all("Requires-Dist"))


def test_redislock_app_without_pytest_celery_says_what_to_install(pytester):
    pytester.makepyfile("""
        def test_needs_the_app(redislock_app):
            pass
    """)
    result = pytester.runpytest("-p", "no:celery", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # the fixture fails, naming what to install
    assert "pip install 'celery-redislock[pytest]'" in result.stdout.str()
