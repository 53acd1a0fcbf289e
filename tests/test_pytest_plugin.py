"""The package's pytest plugin: a throw-away real Redis for users' integration tests."""

from __future__ import annotations

import redis

from celery_redislock import LimitedTask, Semaphore


def test_redislock_url_is_a_private_empty_server(redislock_url):
    client = redis.Redis.from_url(redislock_url)
    assert client.dbsize() == 0
    assert client.connection_pool.connection_kwargs["port"] != 6379
    assert Semaphore(client, "plugin").acquire() is not None


def test_redislock_app_runs_limited_tasks(redislock_app, redislock_url):
    @redislock_app.task(base=LimitedTask, lock_key="plugin-task", bind=True, shared=False)
    def limited(self):
        return self.request.redislock_lease.name

    assert limited.apply().get() == "plugin-task"
    assert Semaphore(redis.Redis.from_url(redislock_url), "plugin-task").holders() == 0
