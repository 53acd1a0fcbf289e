"""The parked line on a real 3-master Redis Cluster (its lock store side): a run whose
limits lie in one hash slot parks, is handed its slot, and the poll finds its key
through the key space's index, which lies in another slot and is written by a command
of its own."""

from __future__ import annotations

import time

import pytest

from celery_redislock.engine.admission import Busy, Lease, ParkedMove, SlotLimit
from celery_redislock.engine.parking import (
    due,
    local_index,
    park_admit,
    parked_keys,
    prepare_park_admit,
    run_id,
)
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
                              lease=5, run="t:0") is None
    assert prepare_park_admit(client, [SlotLimit(a, 1, PREFIX)], lease=5, run="t:0")
