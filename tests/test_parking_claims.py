"""A parked run's claim when its holder never releases (its release failed: the lock
store was restarted under it), on a real redis-server: found by the history check on
the broker line, where such claims were left once everything had settled."""

from __future__ import annotations

import time

import pytest

from celery_redislock.engine.admission import Busy, Lease, ParkedMove, SlotLimit
from celery_redislock.engine.parked_view import read_parked_lines
from celery_redislock.engine.parking import due, park_admit, run_id

PREFIX = "redislock:"


@pytest.mark.xfail(strict=True, reason="a claim is dropped only by its holder's release "
                   "(or its body's start): a holder whose lease ran out unreleased keeps "
                   "its claim, and its reference, as long as the line is busy")
def test_a_claim_whose_lease_ran_out_unreleased_is_dropped(redis_client):
    limit = [SlotLimit("claims", 1, PREFIX)]
    key = limit[0].key
    first = park_admit(redis_client, limit, lease=30, run=run_id("first", 0))
    assert isinstance(first, Lease)
    parked = park_admit(redis_client, limit, lease=30, run=run_id("moved", 0))
    assert isinstance(parked, Busy) and parked.park is not None
    assert first.release()
    assert [h for h in first.handoffs if isinstance(h, ParkedMove)] == [ParkedMove(key)]
    moved = park_admit(redis_client, limit, lease=0.3, run=run_id("moved", 0),
                       parked=parked.park)  # the moved copy claims its reservation
    assert isinstance(moved, Lease)
    time.sleep(0.5)  # its release fails (the store unreachable): its lease runs out
    due(redis_client, {key: 0}, prefix=PREFIX)  # the poll, as once everything settled
    seconds, micros = redis_client.time()
    line = read_parked_lines(redis_client, [key], seconds * 1000 + micros // 1000).get(key)
    assert line is None or line.claimed == 0
