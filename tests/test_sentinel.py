"""The lock store behind a real Redis Sentinel (``sentinel://`` URLs, as kombu takes them)."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_redislock import LimitedTask, LockConfigurationError, Semaphore
from celery_redislock.config.settings import read_settings, redis_client

from redis_process import RedisServer, SentinelServer


@pytest.fixture(scope="module")
def sentinel():
    master = RedisServer().start()
    watcher = SentinelServer(master).start()
    yield watcher
    watcher.cleanup()
    master.cleanup()


def sentinel_app(url, **conf):
    app = Celery("sentinel", set_as_current=False)
    app.conf.update(conf)
    app.conf.redislock_url = url
    return app


def test_semaphore_through_sentinel_lives_on_the_master(sentinel):
    app = sentinel_app(sentinel.url, redislock_transport_options={"master_name": "mymaster"})
    client = redis_client(app)
    sem = Semaphore(client, "through-sentinel", slots=1)
    lease = sem.acquire(blocking=False)
    assert lease is not None and sem.acquire(blocking=False) is None
    assert sentinel.master.client().zcard(sem.key) >= 1
    assert sem.release(lease)


def test_several_sentinels_and_the_broker_url_are_read(sentinel):
    url = f"{sentinel.url};sentinel://127.0.0.1:1/0"
    app = Celery("sentinel", set_as_current=False, broker=url)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    settings = read_settings(app)
    assert settings.url == url
    assert settings.transport_options == {"master_name": "mymaster"}
    assert redis_client(app, settings).ping()


def test_sentinel_url_without_master_name_is_refused(sentinel):
    app = sentinel_app(sentinel.url)
    with pytest.raises(LockConfigurationError, match="master_name"):
        redis_client(app)


def test_limited_task_with_a_sentinel_lock_store(celery_app, celery_worker, sentinel):
    celery_app.conf.redislock_url = sentinel.url
    celery_app.conf.redislock_transport_options = {"master_name": "mymaster"}

    @celery_app.task(base=LimitedTask, lock_key="sentinel-task", bind=True, shared=False)
    def guarded(self):
        return self.request.redislock_lease.fence > 0

    celery_worker.reload()
    assert guarded.delay().get(timeout=10) is True
    master = sentinel.master.client()
    assert all(set(master.zrange(key, 0, -1)) <= {b"#fence", b"#hold", b"#slots", b"#ttl"}
               for key in master.keys("*sentinel-task*"))
