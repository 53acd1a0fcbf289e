"""The control API (``celery_redislock.admin.control``): slot overrides, pauses, resume, state.

Against a real redis-server, with real ``Semaphore`` / ``RateLimiter`` admissions, and
a real prefork worker for the paths that run inside tasks.
"""

from __future__ import annotations

import datetime
import uuid

import pytest

from celery_redislock import LimitedTask, LockKeyError, Rate, Semaphore
from celery_redislock.admin.control import (
    LimitControlError,
    clear_rate,
    clear_slots,
    limit_keys,
    limit_state,
    pause,
    pause_key_of,
    resume,
    set_rate,
    set_slots,
)
from celery_redislock.engine.admission import Busy, Lease, Paused, RateLimit, admit
from celery_redislock.engine.keys import DEFAULT_PREFIX, companion_key, rate_key, semaphore_key

from cli_app import CALL_API, CALL_API_PATIENT, CRAWL, api_name, create_app, create_worker_app
from support import wait_until
from worker_cluster import WorkerCluster


def server_now(client) -> float:
    seconds, microseconds = client.time()
    return seconds + microseconds / 1e6


def take(semaphore, count):
    """``count`` leases of ``semaphore``; fails if any is refused."""
    leases = [semaphore.attempt() for _ in range(count)]
    assert all(isinstance(lease, Lease) for lease in leases), leases
    return leases


def test_set_slots_raises_the_limit(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=1)
    take(semaphore, 1)
    assert isinstance(semaphore.attempt(), Busy)
    assert set_slots(lock_client, "crawl", 3) == 0  # no app: nobody to wake
    take(semaphore, 2)
    assert isinstance(semaphore.attempt(), Busy)
    state = limit_state(lock_client, "crawl")
    assert (state.used, state.limit, state.configured_slots, state.slots_override) == (
        3, 3, 1, 3)


def test_shrinking_never_evicts_holders_they_drain(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=3)
    leases = take(semaphore, 3)
    set_slots(lock_client, "crawl", 1)
    assert all(lease.renew() for lease in leases)  # every holder keeps its slot
    assert limit_state(lock_client, "crawl").used == 3
    assert isinstance(semaphore.attempt(), Busy)
    assert leases[0].release() and leases[1].release()
    assert isinstance(semaphore.attempt(), Busy)  # 1 holder = the new limit of 1
    assert leases[2].release()
    take(semaphore, 1)
    assert isinstance(semaphore.attempt(), Busy)


def test_clear_slots_restores_the_configured_limit(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=2)
    set_slots(lock_client, "crawl", 1)
    first = take(semaphore, 1)[0]
    assert isinstance(semaphore.attempt(), Busy)
    assert clear_slots(lock_client, "crawl") is True
    assert clear_slots(lock_client, "crawl") is False
    take(semaphore, 1)
    assert isinstance(semaphore.attempt(), Busy)
    state = limit_state(lock_client, "crawl")
    assert (state.limit, state.slots_override) == (2, None)
    assert first.release()


def test_pause_refuses_admission_until_resume(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=2)
    held = take(semaphore, 1)[0]
    assert pause(lock_client, "crawl") is None  # for ever
    refused = semaphore.attempt()
    assert isinstance(refused, Paused) and refused.retry_hint is None
    assert held.renew()  # a holder is not touched by a pause
    state = limit_state(lock_client, "crawl")
    assert state.paused and state.paused_until_ms is None and state.used == 1
    assert resume(lock_client, "crawl") is True
    assert resume(lock_client, "crawl") is False
    take(semaphore, 1)
    assert not limit_state(lock_client, "crawl").paused


def test_pause_for_seconds_counts_on_the_server_clock(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=1)
    before = server_now(lock_client)
    end = pause(lock_client, "crawl", seconds=5)
    after = server_now(lock_client)
    assert before + 5 <= end + 0.001 and end <= after + 5 + 0.001
    # The hints count down on the server's clock: from the end, less the server time
    # after the call (however long the machine took to get there), never more than 5 s.
    refused = semaphore.attempt()
    assert isinstance(refused, Paused)
    assert end - server_now(lock_client) - 0.001 <= refused.retry_hint <= 5
    state = limit_state(lock_client, "crawl")
    assert state.paused and state.paused_until_ms == round(end * 1000)
    assert end - server_now(lock_client) - 0.001 <= state.pause_left <= 5


def test_a_pause_that_ended_admits_again(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=1)
    pause(lock_client, "crawl", seconds=0.2)
    assert isinstance(semaphore.attempt(), Paused)
    wait_until(lambda: isinstance(semaphore.attempt(), Lease), timeout=5,
               what="the pause to end")
    assert not limit_state(lock_client, "crawl").paused


def test_pause_until_a_datetime_or_unix_seconds(lock_client):
    now = server_now(lock_client)
    moment = datetime.datetime.fromtimestamp(now + 60, tz=datetime.timezone.utc)
    assert pause(lock_client, "crawl", until=moment) == pytest.approx(now + 60, abs=0.002)
    assert pause(lock_client, "crawl", until=now + 30) == pytest.approx(now + 30, abs=0.002)
    assert limit_state(lock_client, "crawl").pause_left == pytest.approx(30, abs=1)


def test_keep_longer_leaves_a_longer_pause(lock_client):
    long_end = pause(lock_client, "crawl", seconds=60)
    assert pause(lock_client, "crawl", seconds=5, keep_longer=True) == long_end
    longer = pause(lock_client, "crawl", seconds=120, keep_longer=True)
    assert longer > long_end
    assert pause(lock_client, "crawl") is None
    assert pause(lock_client, "crawl", seconds=5, keep_longer=True) is None
    assert limit_state(lock_client, "crawl").paused_until_ms is None
    assert pause(lock_client, "crawl", seconds=5) is not None  # without: replaced


def test_pause_applies_to_the_rate_limiter_of_the_name(lock_client):
    rate = RateLimit("crawl", Rate.parse("100/s"), DEFAULT_PREFIX)
    assert isinstance(admit(lock_client, [rate], lease=1), Lease)
    end = pause(lock_client, "crawl", seconds=30)
    refused = admit(lock_client, [rate], lease=1)
    assert isinstance(refused, Paused)
    assert end - server_now(lock_client) - 0.001 <= refused.retry_hint <= 30
    assert limit_state(lock_client, "crawl").paused  # shown although no semaphore exists
    resume(lock_client, "crawl")
    wait_until(lambda: isinstance(admit(lock_client, [rate], lease=1), Lease), timeout=5,
               what="the rate limiter to admit again")


def test_full_keys_and_other_prefixes(lock_client):
    semaphore = Semaphore(lock_client, "crawl", slots=1, prefix="other:")
    key = semaphore_key("crawl", "other:")
    assert limit_keys(key, "other:") == (key, rate_key("crawl", "other:"))
    pause(lock_client, key, seconds=30, prefix="other:")
    assert isinstance(semaphore.attempt(), Paused)
    assert not limit_state(lock_client, "crawl").paused  # the default prefix: another key
    resume(lock_client, "crawl", prefix="other:")
    take(semaphore, 1)


def test_with_the_app(lock_client, redis_server):
    from support import LOCK_DB

    app = create_app(f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}")
    semaphore = Semaphore(lock_client, CRAWL, slots=2)
    take(semaphore, 2)
    assert set_slots(app, CRAWL, 3) == 0  # nobody waits
    take(semaphore, 1)
    pause(app, CRAWL, seconds=10)
    assert limit_state(app, CRAWL).paused
    assert resume(app, CRAWL) is True


def control_ttls(client, name):
    """PTTL (ms) of the control hashes of ``name``: -2 gone, -1 no TTL."""
    semaphore = semaphore_key(name)
    return (client.pttl(companion_key(semaphore, "cs")),
            client.pttl(companion_key(semaphore, "cr")))


def test_a_timed_pause_leaves_no_key_without_a_ttl(lock_client):
    """A pause with an end writes its control hashes with that end as their TTL: once
    it ends they are gone; an override in the same hash lasts (no TTL) and keeps the
    pause's end; clearing it gives the hash back the pause's TTL."""
    pause(lock_client, "leak", seconds=30)
    assert all(0 < ttl <= 30_000 for ttl in control_ttls(lock_client, "leak"))
    set_slots(lock_client, "leak", 3)
    set_rate(lock_client, "leak", "5/s")
    assert control_ttls(lock_client, "leak") == (-1, -1)  # overrides last
    assert limit_state(lock_client, "leak").paused
    clear_slots(lock_client, "leak")
    clear_rate(lock_client, "leak")
    assert all(0 < ttl <= 30_000 for ttl in control_ttls(lock_client, "leak"))
    pause(lock_client, "leak")                               # for ever: until resume
    assert control_ttls(lock_client, "leak") == (-1, -1)
    assert resume(lock_client, "leak") is True
    assert control_ttls(lock_client, "leak") == (-2, -2)
    pause(lock_client, "far", until=1e300)                   # as good as for ever
    assert control_ttls(lock_client, "far") == (-1, -1)
    assert resume(lock_client, "far") is True
    pause(lock_client, "short", seconds=0.2)
    wait_until(lambda: control_ttls(lock_client, "short") == (-2, -2), timeout=10,
               what="the control hashes of an ended pause to expire")
    lasting = [key for key in lock_client.scan_iter() if lock_client.pttl(key) == -1]
    assert lasting == [], lasting


def test_pause_key_of_needs_only_the_arguments_the_key_uses(lock_client, redis_server):
    from support import LOCK_DB

    app = create_app(f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}")

    @app.task(base=LimitedTask, bind=True, shared=False, name="cli_app.fetch",
              lock_key="api:{token}")
    def fetch(self, token, i):
        return None

    task = app.tasks["cli_app.fetch"]  # what a bound task's body has as ``self``
    end = pause_key_of(task, "t1", seconds=30)
    assert limit_state(app, "api:t1").paused and end is not None
    assert pause_key_of(task, token="t2", seconds=30) is not None
    assert limit_state(app, "api:t2").paused
    with pytest.raises(LockKeyError, match="needs argument 'token'"):
        pause_key_of(task, i=3, seconds=30)


@pytest.mark.parametrize("slots", [0, -1, "x", 1.5, True, None])
def test_bad_slot_counts_are_refused(lock_client, slots):
    with pytest.raises(LimitControlError, match="slots of 'crawl' must be"):
        set_slots(lock_client, "crawl", slots)
    assert not lock_client.exists(semaphore_key("crawl").replace("}:s:", "}:cs:"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seconds": 0}, "seconds must be a number > 0"),
    ({"seconds": -5}, "seconds must be a number > 0"),
    ({"seconds": float("inf")}, "seconds must be a number > 0"),
    ({"seconds": "10"}, "seconds must be a number > 0"),
    ({"until": "tomorrow"}, "until must be a datetime or Unix seconds"),
    ({"until": 1.0}, "is not after the lock store's time now"),
    ({"until": 1e9, "seconds": 3}, "give until or seconds, not both"),
])
def test_bad_pauses_are_refused(lock_client, kwargs, message):
    with pytest.raises(LimitControlError, match=message):
        pause(lock_client, "crawl", **kwargs)
    assert not limit_state(lock_client, "crawl").paused


def test_bad_targets_and_names(lock_client):
    with pytest.raises(LimitControlError, match="expected a Celery app or a redis-py client"):
        pause(object(), "crawl")
    with pytest.raises(LimitControlError, match="non-empty string"):
        set_slots(lock_client, "", 2)


def test_pause_key_of_a_task_without_limits():
    app = create_app("redis://127.0.0.1:1/0")

    @app.task(name="cli_app.plain", shared=False)
    def plain():
        return None

    with pytest.raises(LimitControlError, match=r"'cli_app\.plain' has no celery-redislock limit"):
        pause_key_of(plain, seconds=5)


# --- inside real workers -----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with WorkerCluster(tmp_path_factory.mktemp("control-workers"), app_module="cli_app",
                       app_factory=create_worker_app, workers=1, concurrency=2) as running:
        yield running


def token() -> str:
    return uuid.uuid4().hex[:12]


def records(cluster):
    return cluster.redis.client(db=3)


def refusals(cluster, task_id):
    return [r.decode() for r in records(cluster).lrange(f"refused:{task_id}", 0, -1)]


def test_a_paused_key_keeps_runs_waiting_until_resumed(cluster):
    name = api_name(token())
    pause(cluster.app, name)
    result = cluster.app.send_task(CALL_API, (name[4:],))
    wait_until(lambda: len(refusals(cluster, result.id)) >= 1, timeout=30,
               what="the run to be refused")  # parked: once
    assert all("paused" in reason or "parked behind" in reason
               for reason in refusals(cluster, result.id))
    assert not records(cluster).hexists("started", result.id)
    resume(cluster.app, name)
    assert result.get(timeout=30) == result.id


def test_a_task_pauses_its_own_key_after_a_429(cluster):
    key_token = token()
    end = cluster.app.send_task(CALL_API, (key_token,), {"retry_after": 2}).get(timeout=30)
    state = limit_state(cluster.app, api_name(key_token))
    # Still paused until the end the task set, unless a loaded machine took the 2 s to
    # get here (judged on the server's clock).
    if state.paused:
        assert state.paused_until_ms == round(end * 1000) and 0 < state.pause_left <= 2
    else:
        assert server_now(records(cluster)) >= end
    later = cluster.app.send_task(CALL_API, (key_token,))
    assert later.get(timeout=30) == later.id
    # The next run did not start before the pause ended (both on the server's clock).
    assert int(records(cluster).hget("started", later.id)) >= end * 1_000_000 - 1_000
    started_us = int(records(cluster).hget("started", later.id))
    assert started_us >= end * 1_000_000  # not before the pause ended (server clock)


def test_raising_slots_wakes_waiting_runs_at_once(cluster):
    key_token = token()
    name = api_name(key_token)
    holder = cluster.app.send_task(CALL_API_PATIENT, (key_token,), {"hold": True})
    wait_until(lambda: records(cluster).hexists("started", holder.id), timeout=30,
               what="the first run to start")
    waiter = cluster.app.send_task(CALL_API_PATIENT, (key_token,), {"hold": True})
    wait_until(lambda: limit_state(cluster.app, name).waiting == 1, timeout=30,
               what="the second run to wait in line")
    # The parked run is woken by set_slots itself (1), or by the poll (0).
    assert set_slots(cluster.app, name, 2) in (0, 1)
    wait_until(lambda: records(cluster).hexists("started", waiter.id), timeout=5,
               what="the woken run to start")  # at once, not on its 10-20 s countdown
    state = limit_state(cluster.app, name)
    assert (state.used, state.limit, state.waiting) == (2, 2, 0)
    records(cluster).set(f"go:{key_token}", 1)
    assert holder.get(timeout=30) == holder.id and waiter.get(timeout=30) == waiter.id


def test_runs_refused_by_a_pause_wait_in_line_and_start_on_resume(cluster):
    key_token = token()
    name = api_name(key_token)
    pause(cluster.app, name)
    waiter = cluster.app.send_task(CALL_API_PATIENT, (key_token,))
    wait_until(lambda: limit_state(cluster.app, name).waiting == 1
               and refusals(cluster, waiter.id), timeout=30,
               what="the paused run to be refused and counted as waiting")
    assert not records(cluster).hexists("started", waiter.id)
    assert resume(cluster.app, name) is True
    wait_until(lambda: records(cluster).hexists("started", waiter.id), timeout=5,
               what="the run to start on resume")  # not on its 10-20 s countdown
    assert waiter.get(timeout=30) == waiter.id
    wait_until(lambda: limit_state(cluster.app, name).waiting == 0, timeout=10,
               what="the line to empty")


def test_a_deferred_run_says_once_at_info_why_and_until_when(cluster):
    key_token = token()
    holder = cluster.app.send_task(CALL_API, (key_token,), {"hold": True})
    wait_until(lambda: records(cluster).hexists("started", holder.id), timeout=30,
               what="the first run to start")
    waiter = cluster.app.send_task(CALL_API, (key_token,))
    wait_until(lambda: len(refusals(cluster, waiter.id)) >= 1, timeout=30,
               what="the second run to be refused")
    records(cluster).set(f"go:{key_token}", 1)
    assert waiter.get(timeout=30) == waiter.id and holder.get(timeout=30) == holder.id
    ours = [line for line in cluster.logs().splitlines()
            if waiter.id in line and "celery-redislock" in line]
    assert len(ours) == 1, ours  # not one line per refusal
    assert "INFO" in ours[0] and "parked" in ours[0]  # why, and where it waits
    assert f"the slots of 'api:{key_token}' are taken" in ours[0]
    assert "it waits in their parking queue" in ours[0]


def test_idle_keys_expire_as_the_documented_bounds_say(cluster):
    """docs/semantics.md (Cost): an idle semaphore's key expires, and nothing but
    operators' control hashes lasts for ever."""
    key_token = token()
    holder = cluster.app.send_task(CALL_API, (key_token,), {"hold": True})
    wait_until(lambda: records(cluster).hexists("started", holder.id), timeout=30,
               what="the first run to start")
    waiter = cluster.app.send_task(CALL_API, (key_token,))
    wait_until(lambda: len(refusals(cluster, waiter.id)) >= 1, timeout=30,
               what="the second run to wait")
    records(cluster).set(f"go:{key_token}", 1)
    assert waiter.get(timeout=30) == waiter.id and holder.get(timeout=30) == holder.id
    client = cluster.redis.client(db=2)  # the lock store (worker_app.AppUrls.on_server)
    semaphore = semaphore_key(api_name(key_token))
    ttl = client.pttl(companion_key(semaphore, "s")) / 1000
    line_bound = 1.5 * (0.3 + 11 * 60)  # the task's lock_retry_backoff_max is 0.3 s
    assert 0 < ttl <= line_bound, ttl
    def lasting():
        return [key.decode() for key in client.scan_iter(count=1000)
                if client.ttl(key) == -1]

    # Only operators' control hashes with an override or a pause without an end, once
    # the workers' poll took the emptied parked line out of its index (``...parked``).
    wait_until(lambda: all(":cs:" in key or ":cr:" in key for key in lasting()), timeout=5,
               what=f"only control hashes to last: {lasting()}")
