"""Rate limits' promised starts, on a real Redis server: a run asking long before its
start keeps its place, and a rate whose interval changes at run time re-plans the
starts it promised.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_redislock.admin import control
from celery_redislock.engine.admission import Lease, RateLimit, RateLimited, admit
from celery_redislock.engine.rate import Rate

PREFIX = "redislock:"


def server_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def wait_for_server_time(client: Any, us: int, deadline: float = 10.0) -> None:
    """Poll the server's clock until it reaches ``us`` (no sleep as synchronisation)."""
    give_up = time.monotonic() + deadline
    while server_us(client) < us:
        assert time.monotonic() < give_up, "the server's clock did not move"
        time.sleep(0.005)


def test_a_run_asking_long_before_its_start_takes_no_start_from_runs_due_before(
        redis_client) -> None:
    """1/s, no burst: two runs promised +1 s and +2 s. The first never comes back; at
    +1.2 s the second asks (0.8 s early): the start is free, but it keeps its promise
    (it asks again, to hear of a raised rate, not to overtake); within half a second of
    its start it takes a start left free."""
    rate = RateLimit("early", Rate.parse("1/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    first = admit(redis_client, [rate], lease=1)
    second = admit(redis_client, [rate], lease=1)
    assert isinstance(first, RateLimited) and isinstance(second, RateLimited)
    wait_for_server_time(redis_client, first.promise + 200_000)
    before = server_us(redis_client)
    early = admit(redis_client, [rate], lease=1, promises={rate.key: second.promise})
    if before < second.promise - 500_000:
        assert isinstance(early, RateLimited) and early.promise == second.promise
    wait_for_server_time(redis_client, second.promise - 400_000)
    assert isinstance(admit(redis_client, [rate], lease=1,
                            promises={rate.key: second.promise}), Lease)


def test_raised_rate_moves_promised_starts_earlier(redis_client) -> None:
    """2/s, no burst: ten runs promised starts 0.5 s apart. Raised to 20/s, a run that
    was promised a start 5 s away is promised one about 0.5 s away (or admitted); a
    newcomer goes behind the re-planned line, not behind the old one."""
    rate = RateLimit("raise", Rate.parse("2/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    promised = [admit(redis_client, [rate], lease=1) for _ in range(10)]
    assert all(isinstance(one, RateLimited) for one in promised)
    old_end = int(redis_client.hget(rate.key, "line"))
    control.set_rate(redis_client, "raise", "20/s")
    changed = server_us(redis_client)
    last = admit(redis_client, [rate], lease=1, promises={rate.key: promised[-1].promise})
    assert isinstance(last, RateLimited)
    assert last.promise - changed < 0.1 * (promised[-1].promise - changed) + 100_000
    newcomer = admit(redis_client, [rate], lease=1)
    assert isinstance(newcomer, RateLimited)
    assert newcomer.promise < changed + 1_000_000 < old_end
    assert redis_client.hget(rate.key, "rp") is not None
    control.clear_rate(redis_client, "raise")


def test_lowered_rate_moves_promised_starts_later(redis_client) -> None:
    """20/s, no burst: ten runs promised starts 50 ms apart. Lowered to 2/s, the run
    promised the fifth start is promised one about 2.5 s away, and runs promised before
    the change keep their order at the new pace."""
    rate = RateLimit("lower", Rate.parse("20/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    promised = [admit(redis_client, [rate], lease=1) for _ in range(10)]
    assert all(isinstance(one, RateLimited) for one in promised)
    control.set_rate(redis_client, "lower", "2/s")
    fifth = admit(redis_client, [rate], lease=1, promises={rate.key: promised[4].promise})
    ninth = admit(redis_client, [rate], lease=1, promises={rate.key: promised[8].promise})
    assert isinstance(fifth, RateLimited) and isinstance(ninth, RateLimited)
    changed = int(redis_client.hget(rate.key, "rp").split()[0])
    assert fifth.promise - changed == pytest.approx(10 * (promised[4].promise - changed), abs=20)
    assert ninth.promise - fifth.promise == 4 * 500_000
    newcomer = admit(redis_client, [rate], lease=1)
    assert isinstance(newcomer, RateLimited) and newcomer.promise > ninth.promise
    control.clear_rate(redis_client, "lower")


def test_a_promise_is_moved_once_however_often_its_run_asks(redis_client) -> None:
    """Raised from 1/s to 2/s: a run promised a start 6 s away is moved to about 3 s
    away, and asking again (twice) keeps that start: a moved promise is not moved
    again."""
    rate = RateLimit("once", Rate.parse("1/s", burst=0), PREFIX)
    assert isinstance(admit(redis_client, [rate], lease=1), Lease)
    promised = [admit(redis_client, [rate], lease=1) for _ in range(6)]
    control.set_rate(redis_client, "once", "2/s")
    moved = admit(redis_client, [rate], lease=1, promises={rate.key: promised[-1].promise})
    assert isinstance(moved, RateLimited) and moved.promise < promised[-1].promise - 2_000_000
    for _ in range(2):
        again = admit(redis_client, [rate], lease=1, promises={rate.key: moved.promise})
        assert isinstance(again, RateLimited) and again.promise == moved.promise
    control.clear_rate(redis_client, "once")


def test_rate_recheck_setting_is_checked() -> None:
    """``redislock_rate_recheck``: seconds above zero, or None."""
    from celery import Celery

    from celery_redislock.config.settings import read_settings
    from celery_redislock.errors import LockConfigurationError

    app = Celery(set_as_current=False)
    assert read_settings(app).rate_recheck == 1.0
    app.conf.redislock_rate_recheck = None
    assert read_settings(app).rate_recheck is None
    app.conf.redislock_rate_recheck = 30
    assert read_settings(app).rate_recheck == 30.0
    for bad in (0, -1, "1s", True, float("nan")):
        app.conf.redislock_rate_recheck = bad
        with pytest.raises(LockConfigurationError, match="redislock_rate_recheck"):
            read_settings(app)
