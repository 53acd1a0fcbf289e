"""The engine and LimitedTask on a real 3-master Redis Cluster started locally."""

from __future__ import annotations

import pytest

from celery_redislock import LimitedTask, RateLimiter, Semaphore
from celery_redislock.engine.admission import Busy, Lease, RateLimit, SlotLimit, admit
from celery_redislock.engine.rate import Rate
from celery_redislock.engine.scripts import by_hash_slot
from celery_redislock.gate.recovery import free_worker_slots

from redis_process import RedisClusterServers


@pytest.fixture(scope="module")
def cluster():
    servers = RedisClusterServers().start()
    yield servers
    servers.cleanup()


@pytest.fixture
def client(cluster):
    client = cluster.client()
    client.flushall()
    yield client
    client.close()


def test_semaphore_on_a_cluster(client):
    sem = Semaphore(client, "cluster-sem", slots=2, lease=10)
    first, second = sem.acquire(blocking=False), sem.acquire(blocking=False)
    assert first is not None and second is not None
    assert sem.acquire(blocking=False) is None
    assert sem.holders() == 2
    assert first.renew()
    assert sem.release(first) and not sem.release(first)
    assert sem.holders() == 1


def test_rate_limiter_on_a_cluster(client):
    limiter = RateLimiter(client, "cluster-rate", "1/h", burst=0)
    assert limiter.try_acquire()
    assert not limiter.try_acquire()


def names_in_different_slots(client):
    names = [f"spread-{n}" for n in range(50)]
    keys = {SlotLimit(name, 1, "redislock:").key: name for name in names}
    groups = by_hash_slot(client, list(keys))
    return keys[groups[0][0]], keys[groups[1][0]]


def test_limits_in_different_slots_are_all_or_nothing(client):
    a, b = names_in_different_slots(client)
    limit_a, limit_b = SlotLimit(a, 1, "redislock:"), SlotLimit(b, 1, "redislock:")
    rate = RateLimit(a, Rate.parse("1000/s"), "redislock:")
    held_b = admit(client, [limit_b], lease=10)
    assert isinstance(held_b, Lease)
    refused = admit(client, [limit_a, rate, limit_b], lease=10)
    assert isinstance(refused, Busy) and refused.name == b
    assert Semaphore(client, a).holders() == 0  # slot A was taken, then given back
    held_b.release()
    both = admit(client, [limit_a, rate, limit_b], lease=10)
    assert isinstance(both, Lease)
    assert Semaphore(client, a).holders() == 1 and Semaphore(client, b).holders() == 1
    assert both.renew()
    assert both.release()
    assert Semaphore(client, a).holders() == 0 and Semaphore(client, b).holders() == 0


def test_a_worker_frees_its_previous_life_on_every_node(client):
    from celery import Celery

    app = Celery("cluster", set_as_current=False)
    app.conf.redislock_client = client
    names = [f"life-{n}" for n in range(12)]
    for name in names:
        assert admit(client, [SlotLimit(name, 1, "redislock:")], lease=30,
                     owner="node1@host|task|") is not None
    keep = admit(client, [SlotLimit("other", 1, "redislock:")], lease=30,
                 owner="node2@host|task|")
    assert free_worker_slots(app, "node1@host") == len(names)
    assert all(Semaphore(client, name).holders() == 0 for name in names)
    assert Semaphore(client, "other").holders() == 1
    keep.release()


def test_limited_task_with_a_cluster_lock_store(celery_app, celery_worker, client):
    celery_app.conf.redislock_client = client

    @celery_app.task(base=LimitedTask, lock_key="in-cluster:{n}", bind=True, shared=False)
    def clustered(self, n):
        return Semaphore(client, f"in-cluster:{n}").holders()

    celery_worker.reload()
    assert [clustered.delay(n).get(timeout=10) for n in range(3)] == [1, 1, 1]
    assert all(Semaphore(client, f"in-cluster:{n}").holders() == 0 for n in range(3))
