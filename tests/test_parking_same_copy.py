"""A moved copy's own admission, carried out by the lock store but its reply lost (the
store paused past the client's timeout, or the connection broken after the write), on a
real redis-server: found by the history check (a rate-limited run, default acks, ended
unrun as served when the same copy asked again). Under default acks too the copy's id
(the ``move`` of its wait header) is sent with its admission, so that the very copy
asking again is admitted (its body has not started, or its acknowledgement was lost:
Celery alone would run it), while another copy of the run still ends unrun."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from celery_redislock.config.retry import RetryPolicy
from celery_redislock.engine.admission import Busy, Lease, ParkRef, RateLimit, Served, SlotLimit
from celery_redislock.engine.parking import ParkAsk, park_admit, run_id, started
from celery_redislock.engine.parking_rate import rate_park_admit
from celery_redislock.engine.rate import Rate
from celery_redislock.pool.attempt import Attempt
from celery_redislock.run.waiting_run import WaitingRun

PREFIX = "redislock:"


def ask_of(limiters: Sequence[Any], task_id: str, park: ParkRef, move: str,
           acks_late: bool = False) -> ParkAsk:
    """The ask a moved copy (its id ``move``) of ``task_id`` sends, as its run builds it."""
    attempt = Attempt(
        task=SimpleNamespace(acks_late=acks_late),
        setup=SimpleNamespace(limits=SimpleNamespace(lease=30, retry=RetryPolicy()),
                              keep_served_ms=3600 * 1000, low_first=False),
        request=SimpleNamespace(id=task_id, retries=0, delivery_info={}),
        limiters=limiters, description="d", owner="o",
        waited=WaitingRun(park_id=park.park_id, line=park.key, move=move, carried=True),
        promises={}, eager=False, reserve_ms=0, parking=True)
    return attempt.park_ask()


def test_default_acks_a_rate_admission_whose_reply_was_lost_admits_the_same_copy(
        redis_client: Any) -> None:
    rate = [RateLimit("same-copy", Rate.parse("10/s", burst=0), PREFIX)]
    assert isinstance(rate_park_admit(redis_client, rate, lease=5, run="s0:0"), Lease)
    parked = rate_park_admit(redis_client, rate, lease=5, run=run_id("s1", 0))
    assert isinstance(parked, Busy) and parked.park is not None
    time.sleep(0.25)  # its promised start is past

    def ask(move: str) -> Any:
        return rate_park_admit(redis_client, rate, ask_of(rate, "s1", parked.park, move))

    lost: Optional[Any] = ask("c1")  # carried out; its reply never read
    assert isinstance(lost, Lease)
    time.sleep(0.25)  # room at the rate again
    assert isinstance(ask("c1"), Lease)  # the same copy asking again: a new start
    assert isinstance(ask("c2"), Served)  # another copy of the run ends unrun


def test_default_acks_a_slot_served_at_start_admits_the_same_copy_only(
        redis_client: Any) -> None:
    """A semaphore under default acks: the moved copy's reference becomes served when its
    body starts. That very copy comes back only if its acknowledgement was lost (the
    broker gives it back, and Celery alone runs it again): it takes a slot; another copy
    ends unrun."""
    limit = [SlotLimit("same-copy", 1, PREFIX)]
    first = park_admit(redis_client, limit, lease=30, run=run_id("f", 0))
    assert isinstance(first, Lease)
    parked = park_admit(redis_client, limit, lease=30, run=run_id("m", 0))
    assert isinstance(parked, Busy) and parked.park is not None
    assert first.release()

    def ask(move: str) -> Any:
        return park_admit(redis_client, limit, ask_of(limit, "m", parked.park, move))

    moved = ask("c1")
    assert isinstance(moved, Lease)
    started(moved)  # its body starts: the reference is served
    assert moved.release()
    assert isinstance(ask("c2"), Served)
    again = ask("c1")
    assert isinstance(again, Lease) and again.release()


def test_acks_late_still_sends_the_copy_id() -> None:
    park = ParkRef("redislock:{x}:s:y", "1:2")
    assert ask_of([], "t", park, "c1", acks_late=True).copy == "c1"
    assert ask_of([], "t", park, "c1").copy == "c1"
