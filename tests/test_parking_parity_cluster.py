"""The parked line on a real 3-master Redis Cluster (its lock store side): a run whose
limits lie in one hash slot (semaphores, rate limits, both) parks, is handed its slot or
its start, and the poll finds its key through the key space's index, which lies in
another slot and is written by a command of its own."""

from __future__ import annotations

import time

import pytest

from celery_redislock.engine.admission import (
    Booked,
    Busy,
    Lease,
    ParkedMove,
    RateLimit,
    SlotLimit,
)
from celery_redislock.engine.parking import (
    DeadlineMove,
    GaveUp,
    ParkAsk,
    due,
    local_index,
    local_rate_index,
    park_admit,
    parked_keys,
    prepare_park_admit,
    run_id,
)
from celery_redislock.engine.parking_rate import due_rate, rate_park_admit, rate_parked_keys
from celery_redislock.engine.rate import Rate
from celery_redislock.engine.scripts import by_hash_slot

from redis_process import RedisClusterServers

PREFIX = "redislock:"


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


def test_a_run_parks_and_is_handed_its_slot_on_a_cluster(client):
    limiters = [SlotLimit("cluster-parked", 1, PREFIX)]
    key = limiters[0].key
    holder = park_admit(client, limiters, lease=30, run=run_id("h", 0))
    assert isinstance(holder, Lease)
    waiter = park_admit(client, limiters, lease=30, run=run_id("w", 0))
    assert isinstance(waiter, Busy) and waiter.park is not None
    assert parked_keys(client, PREFIX) == [key]
    assert holder.release() and holder.handoffs == [ParkedMove(key)]
    moved = park_admit(client, limiters, lease=30, run=run_id("w", 0), parked=waiter.park)
    assert isinstance(moved, Lease)
    assert moved.release()
    # The poll: the line is empty and its parking queue too: the key leaves both indexes.
    assert due(client, {key: 0}, prefix=PREFIX) == []
    assert parked_keys(client, PREFIX) == [] and client.zcard(local_index(key)) == 0


def test_the_poll_hands_over_a_slot_whose_lease_ran_out_on_a_cluster(client):
    limiters = [SlotLimit("cluster-lapsed", 1, PREFIX)]
    key = limiters[0].key
    assert isinstance(park_admit(client, limiters, lease=0.2, run=run_id("h", 0)), Lease)
    waiter = park_admit(client, limiters, lease=30, run=run_id("w", 0), max_wait=60)
    assert isinstance(waiter, Busy)
    time.sleep(0.3)
    assert due(client, {key: 1}, prefix=PREFIX) == [ParkedMove(key)]
    assert isinstance(park_admit(client, limiters, lease=30, run=run_id("w", 0),
                                 parked=waiter.park, max_wait=60), Lease)


def test_limits_in_two_slots_keep_todays_line_on_a_cluster(client):
    names = [f"spread-{n}" for n in range(50)]
    keys = {SlotLimit(name, 1, PREFIX).key: name for name in names}
    groups = by_hash_slot(client, list(keys))
    a, b = keys[groups[0][0]], keys[groups[1][0]]
    assert prepare_park_admit(client, [SlotLimit(a, 1, PREFIX), SlotLimit(b, 1, PREFIX)],
                              ParkAsk(lease=5, run="t:0")) is None
    assert prepare_park_admit(client, [SlotLimit(a, 1, PREFIX)], ParkAsk(lease=5, run="t:0"))


def test_a_rate_limited_run_parks_and_is_moved_on_a_cluster(client):
    """One rate alone: the refusal parks it (its index entry in the key's own slot, the
    key space's index written after); the poll, one script per key, moves it when its
    start is due; the line empty, the key leaves both indexes."""
    limiters = [RateLimit("cluster-rated", Rate.parse("5/s", burst=0), PREFIX)]
    key = limiters[0].key
    assert isinstance(rate_park_admit(client, limiters, lease=30, run="r0:0"), Lease)
    parked = rate_park_admit(client, limiters, lease=30, run="r1:0")
    assert isinstance(parked, Busy) and parked.park.key == key
    assert rate_parked_keys(client, PREFIX) == [key]
    assert client.zscore(local_rate_index(key), key) is not None
    moves = []
    deadline = time.monotonic() + 5
    while not moves and time.monotonic() < deadline:
        moves = due_rate(client, {key: 1}, prefix=PREFIX)
        time.sleep(0.02)
    assert moves == [ParkedMove(key)]
    moved = rate_park_admit(client, limiters, lease=30, run="r1:0", parked=parked.park,
                            book_ms=500)
    assert isinstance(moved, (Lease, Booked))
    assert due_rate(client, {key: 0}, prefix=PREFIX) == []
    assert rate_parked_keys(client, PREFIX) == [] and client.zcard(local_rate_index(key)) == 0


def test_slots_and_a_rate_of_one_name_park_with_their_max_wait_on_a_cluster(client):
    """A semaphore and a rate of one name share a slot: all or nothing in one script; the
    run parks at the rate, and past its max wait the poll's deadline move gives it up."""
    limiters = [SlotLimit("cluster-mixed", 2, PREFIX),
                RateLimit("cluster-mixed", Rate.parse("1/10s", burst=0), PREFIX)]
    rate = limiters[1].key
    assert len(by_hash_slot(client, [limiter.key for limiter in limiters])) == 1
    first = park_admit(client, limiters, lease=30, run="m0:0", max_wait=0.3)
    assert isinstance(first, Lease)
    parked = park_admit(client, limiters, lease=30, run="m1:0", max_wait=0.3)
    assert isinstance(parked, Busy) and parked.park.key == rate
    assert rate_parked_keys(client, PREFIX) == [rate]
    time.sleep(0.35)
    assert due_rate(client, {rate: 1}, prefix=PREFIX) == [DeadlineMove(rate)]
    gave_up = park_admit(client, limiters, lease=30, run="m1:0", parked=parked.park,
                         max_wait=0.3)
    assert isinstance(gave_up, GaveUp) and gave_up.key == rate
    assert first.release()


def test_only_limits_in_several_slots_keep_todays_line_said_once(client, caplog):
    from celery import Celery

    from celery_redislock.config.settings import read_settings
    from celery_redislock.line import broker_line

    app = Celery("cluster-line", set_as_current=False)
    app.conf.update(redislock_url="redis://127.0.0.1:1/0", redislock_line="broker")
    settings = read_settings(app)
    names = [f"apart-{n}" for n in range(50)]
    keys = {SlotLimit(name, 1, PREFIX).key: name for name in names}
    groups = by_hash_slot(client, list(keys))
    a, b = keys[groups[0][0]], keys[groups[1][0]]
    per_s = Rate.parse("1/s")
    one_slot = [SlotLimit(a, 1, PREFIX), RateLimit(a, per_s, PREFIX)]
    two_slots = [SlotLimit(a, 1, PREFIX), RateLimit(b, per_s, PREFIX)]
    with caplog.at_level("WARNING"):
        for _ in range(3):
            assert broker_line.parks(settings, client, one_slot, loop=True, task_name="t.one")
            assert broker_line.parks(settings, client, [RateLimit(b, per_s, PREFIX)],
                                     loop=True, task_name="t.rate")
            assert not broker_line.parks(settings, client, two_slots, loop=True,
                                         task_name="t.two")
    said = [r.getMessage() for r in caplog.records if 'cannot park its runs' in r.getMessage()]
    assert len(said) == 1 and "t.two" in said[0]


def test_rate_limited_runs_park_with_a_cluster_lock_store(celery_app, celery_worker, client,
                                                          caplog):
    """A worker on the parking line whose lock store is a Redis Cluster: runs of a rate
    limit park (one message each) and start at the rate, each once."""
    from celery_redislock import LimitedTask
    from celery_redislock.line.poll import Poll

    celery_app.conf.redislock_client = client
    celery_app.conf.redislock_line = "broker"

    @celery_app.task(base=LimitedTask, lock_key="cluster-worker", lock_rate="5/s",
                     lock_burst=0, shared=False)
    def rated():
        return int(client.time()[0]) * 1_000_000 + int(client.time()[1])

    celery_worker.reload()
    poll = Poll(celery_app).start()  # a worker's, started on worker_ready (not sent here)
    try:
        with caplog.at_level("INFO"):
            results = [rated.delay() for _ in range(6)]
            starts = sorted(result.get(timeout=20) for result in results)
    finally:
        poll.stop()
    assert starts[-1] - starts[0] >= 900_000, starts  # 6 starts at 5/s: a second apart
    logs = "\n".join(record.getMessage() for record in caplog.records)
    assert " parked: " in logs and 'cannot park its runs' not in logs
