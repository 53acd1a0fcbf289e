"""The engine's side of two recoveries, against a real Redis server.

* A lock store that lost its data (flushed, or restarted empty) grants no slot afresh
  until the holders of before have re-asserted their leases or a whole lease has passed;
  fencing numbers keep rising across the loss (see ``store.lua``).
* Freeing what a worker's dead lives held (``release_owner.lua``) never touches the slots
  of a start of the same node name that is registered as live.
"""

from __future__ import annotations

import time

import pytest
import redis
from celery import Celery

from celery_redislock import LimitedTask, LockConfigurationError, Semaphore
from celery_redislock.engine.admission import (
    Busy,
    SlotLimit,
    admit,
    declare_fresh,
    declare_longest_lease,
    owner_prefix,
)
from celery_redislock.engine.scripts import RELEASE_OWNER
from celery_redislock.engine.workers import WorkerRegistration, registry_prefix
from celery_redislock.run.limited import longest_lease

from support import INCARNATION, wait_until

LEASE = 0.5


def first_lease(semaphore, renewing=None, timeout=10 * LEASE):
    """Poll ``semaphore`` until it grants a slot (renewing ``renewing`` meanwhile)."""
    granted = []

    def ask():
        if renewing is not None:
            assert renewing.renew()
        lease = semaphore.acquire(blocking=False)
        if lease is not None:
            granted.append(lease)
        return granted

    wait_until(ask, timeout=timeout, what="a slot granted afresh")
    return granted[0]


def test_after_a_flush_nothing_is_granted_afresh_for_one_lease(redis_client):
    semaphore = Semaphore(redis_client, "loss", slots=2, lease=LEASE)
    held = semaphore.acquire(blocking=False)
    assert held is not None
    redis_client.flushdb()

    flushed = time.monotonic()
    assert semaphore.acquire(blocking=False) is None, "a slot granted beside the holder of before"
    assert held.renew() and not held.lost  # re-asserted in the emptied store
    assert semaphore.holders() == 1
    newcomer = first_lease(semaphore, renewing=held)
    assert time.monotonic() - flushed >= LEASE * 0.9  # server and test clocks may differ
    assert newcomer.fence > held.fence
    assert semaphore.acquire(blocking=False) is None  # the holder of before and the newcomer
    assert held.release() and newcomer.release()


def test_fences_keep_rising_across_a_loss(redis_client):
    semaphore = Semaphore(redis_client, "fences", slots=1, lease=LEASE)
    before = semaphore.acquire(blocking=False)
    redis_client.flushdb()
    assert before.renew()  # re-asserted, with its fencing number
    assert -redis_client.zscore(semaphore.key, "#fence") == before.fence
    assert before.release()
    assert first_lease(semaphore).fence > before.fence


def test_a_lease_that_ran_out_is_not_reasserted(redis_client):
    semaphore = Semaphore(redis_client, "late", slots=1, lease=0.2)
    held = semaphore.acquire(blocking=False)
    redis_client.flushdb()
    assert semaphore.acquire(blocking=False) is None  # the loss is seen: a grace of one lease
    time.sleep(0.3)  # the holder's renewal comes too late: after the grace
    assert not held.renew() and held.lost
    assert semaphore.acquire(blocking=False) is not None


def test_a_store_new_to_this_client_or_emptied_on_purpose_admits_at_once(
        redis_server, redis_client):
    semaphore = Semaphore(redis_client, "fresh", slots=1, lease=30)
    assert semaphore.acquire(blocking=False) is not None
    assert redis_client.keys("*incarnation") == [INCARNATION]
    assert 0 < redis_client.pttl(INCARNATION) <= 7 * 24 * 3600 * 1000  # it never lingers
    redis_client.flushdb()
    declare_fresh(redis_client)
    assert semaphore.acquire(blocking=False) is not None  # said to be emptied on purpose
    redis_client.flushdb()
    other = redis_server.client()  # a process that never saw the store before
    assert Semaphore(other, "fresh", slots=1, lease=30).acquire(blocking=False) is not None
    other.close()


def test_a_registration_tells_children_of_a_worker_about_the_store(redis_client):
    registration = WorkerRegistration(redis_client, "redislock:", "w@host", "abc",
                                      grace=LEASE)
    assert registration.renew()
    assert redis_client.exists(registration.key)
    assert 0 < redis_client.pttl(registration.key) <= 30_000
    redis_client.flushdb()
    assert registration.renew()  # written again, and the loss is seen: a grace
    assert admit(redis_client, [SlotLimit("child", 1, "redislock:")], lease=30).__class__ \
        .__name__ == "Busy"
    registration.unregister()
    assert not redis_client.exists(registration.key)


def test_the_grace_after_a_loss_covers_the_longest_lease_declared(own_redis_server):
    """The first caller after a loss (the store restarted empty) has a short lease, and a
    holder of another key a long one: a caller of that key, whose process declares the
    long lease, is refused past the short grace, until the holder re-asserts (issue 27:
    the grace was the first caller's lease)."""
    long_client, short_client = own_redis_server.client(), own_redis_server.client()
    declare_longest_lease(long_client, 3.0)
    holder = admit(long_client, [SlotLimit("long", 1, "redislock:")], lease=3.0)
    assert admit(short_client, [SlotLimit("short", 1, "redislock:")], lease=0.2).release()
    own_redis_server.restart()  # empty: it keeps nothing on disk

    short = again_on_new_connection(
        lambda: admit(short_client, [SlotLimit("short", 1, "redislock:")], lease=0.2))
    assert isinstance(short, Busy)  # the first caller after the loss: a grace begins
    time.sleep(0.3)  # past a grace of its lease, long before the holder renews
    newcomer = again_on_new_connection(
        lambda: admit(long_client, [SlotLimit("long", 1, "redislock:")], lease=3.0))
    assert isinstance(newcomer, Busy), "a slot granted beside the holder of before"
    assert holder.renew() and not holder.lost  # re-asserted
    assert isinstance(admit(long_client, [SlotLimit("long", 1, "redislock:")], lease=3.0),
                      Busy)
    assert holder.release()
    long_client.close()
    short_client.close()


def again_on_new_connection(call):
    """``call()``, once more if it met a connection the restart closed."""
    try:
        return call()
    except redis.ConnectionError:
        return call()


def _hold(client, name, owner):
    lease = admit(client, [SlotLimit(name, 5, "redislock:")], lease=30, owner=owner)
    assert lease.holds_slots
    return lease


def test_freeing_dead_lives_spares_a_live_namesake(redis_client):
    key = Semaphore(redis_client, "named").key
    live = _hold(redis_client, "named", owner_prefix("w@host", "t1", "live"))
    dead = _hold(redis_client, "named", owner_prefix("w@host", "t2", "dead"))
    old = _hold(redis_client, "named", owner_prefix("w@host", "t3"))  # before start ids
    other = _hold(redis_client, "named", owner_prefix("v@host", "t4", "dead"))
    WorkerRegistration(redis_client, "redislock:", "w@host", "live").renew()

    reply = RELEASE_OWNER.run(redis_client, [key], [
        owner_prefix("w@host"), 0, "dead", registry_prefix("redislock:", "w@host"), "mine"])
    assert reply == [2]
    members = {member.split(b" ")[0].decode() for member in redis_client.zrange(key, 0, -1)}
    assert live.token in members and other.token in members
    assert dead.token not in members and old.token not in members

    mine = _hold(redis_client, "named", owner_prefix("w@host", "t5", "mine"))
    assert RELEASE_OWNER.run(redis_client, [key], [owner_prefix("w@host"), 0, "own", "mine"]) \
        == [1]
    members = {member.split(b" ")[0].decode() for member in redis_client.zrange(key, 0, -1)}
    assert mine.token not in members and live.token in members


def test_a_process_declares_the_longest_lease_of_its_app_or_the_setting():
    """The grace a worker's process declares: the longest lease of its app's limited
    tasks, or ``redislock_max_lease`` if longer (another app's keys on longer leases)."""
    app = Celery("grace", set_as_current=False)

    @app.task(base=LimitedTask, shared=False, name="grace.short", lock_lease=5)
    def short():
        pass

    @app.task(base=LimitedTask, shared=False, name="grace.long", lock_lease=40)
    def long():
        pass

    @app.task(base=LimitedTask, shared=False, name="grace.wrong", lock_slots=0)
    def wrong():
        pass

    with pytest.raises(LockConfigurationError):
        wrong.task_limits()
    assert longest_lease(app) == 40  # a task's wrong limits are its own error
    app.conf.redislock_max_lease = 90
    assert longest_lease(app) == 90
    app.conf.redislock_max_lease = 10  # never below what the app's own tasks hold
    assert longest_lease(app) == 40
    app.conf.redislock_max_lease = "1 minute"
    with pytest.raises(LockConfigurationError, match="redislock_max_lease"):
        longest_lease(app)
