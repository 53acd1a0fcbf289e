"""The leased semaphore against a real redis-server."""

from __future__ import annotations

import threading
import time

import pytest

from celery_redislock import Lease, LockConfigurationError, LockTimeout, Semaphore
from celery_redislock.engine.keys import rate_key, semaphore_key

from support import INCARNATION, wait_until


def test_admits_up_to_slots_then_refuses(redis_client):
    sem = Semaphore(redis_client, "crawler", slots=2, lease=10)
    first, second = sem.acquire(blocking=False), sem.acquire(blocking=False)
    assert isinstance(first, Lease) and isinstance(second, Lease)
    assert sem.acquire(blocking=False) is None
    assert sem.holders() == 2
    busy = sem.attempt()
    assert busy.holders == 2 and busy.slots == 2
    assert 9.0 < busy.retry_hint <= 10.0
    sem.release(first)
    third = sem.acquire(blocking=False)
    assert third is not None


def test_many_threads_never_exceed_slots(redis_server, redis_client):
    slots, threads, rounds = 3, 12, 40
    inside = 0
    peak = 0
    guard = threading.Lock()
    acquired_total = []

    def worker():
        nonlocal inside, peak
        client = redis_server.client()
        sem = Semaphore(client, "hammered", slots=slots, lease=10)
        done = 0
        while done < rounds:
            lease = sem.acquire(blocking=False)
            if lease is None:
                continue
            with guard:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.001)
            with guard:
                inside -= 1
            assert sem.release(lease)
            done += 1
        acquired_total.append(done)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=120)
    assert sum(acquired_total) == threads * rounds
    assert peak == slots  # reached, never exceeded
    assert_idle(redis_client)


def assert_idle(client):
    """An idle semaphore keeps only its statistics, and only until its key expires."""
    for key in client.keys("*"):
        if key == INCARNATION:
            continue  # the one key written once per key space, for good
        assert 0 < client.pttl(key) <= 60_000
        assert {member for member in client.zrange(key, 0, -1)} <= {
            b"#fence", b"#hold", b"#slots", b"#ttl"}


def test_average_hold_is_known_once_contended(redis_client):
    sem = Semaphore(redis_client, "singleton", slots=1, lease=10)
    sem.release(sem.acquire(blocking=False))
    lease = sem.acquire(blocking=False)
    assert sem.attempt().average_hold is None  # refused: holds taken from now on are timed
    sem.release(lease)
    taken = time.monotonic()
    lease = sem.acquire(blocking=False)
    time.sleep(0.2)
    sem.release(lease)
    given_back = time.monotonic()
    held = sem.acquire(blocking=False)
    busy = sem.attempt()
    # The one hold timed: at least the 0.2 s slept, at most what the test saw around it
    # (however slow the machine), to the whole ms the holder reports.
    assert 0.2 - 0.001 <= busy.average_hold <= given_back - taken + 0.001
    sem.release(held)
    assert_idle(redis_client)


def test_expired_lease_frees_its_slot(redis_client):
    sem = Semaphore(redis_client, "short", slots=1, lease=0.3)
    crashed = sem.acquire(blocking=False)  # never renewed nor released: as if its process died
    assert crashed is not None
    assert sem.acquire(blocking=False) is None
    wait_until(lambda: sem.holders() == 0, timeout=5)
    successor = sem.acquire(blocking=False)
    assert successor is not None
    assert successor.fence > crashed.fence
    sem.release(crashed)  # the dead holder's late release cannot free the successor's slot
    assert sem.holders() == 1
    assert sem.release(crashed) is False


def test_renewal_keeps_the_slot_beyond_its_lease(redis_client):
    sem = Semaphore(redis_client, "renewed", slots=1, lease=0.5)
    lease = sem.acquire(keep_alive=True)
    try:
        time.sleep(1.6)  # more than 3 leases: only renewal explains still holding it
        assert sem.acquire(blocking=False) is None
        assert not lease.lost
    finally:
        assert sem.release(lease)
    assert sem.acquire(blocking=False) is not None


def test_manual_renew_and_lost_lease(redis_client):
    # A live lease renews (a 30 s lease: live however slow the machine is), and one left
    # to run out (0.2 s) cannot be renewed and is reported lost.
    sem = Semaphore(redis_client, "manual", slots=1, lease=30)
    lease = sem.acquire(blocking=False)
    before = lease.expires_at_ms
    time.sleep(0.05)
    assert sem.renew(lease)
    assert lease.expires_at_ms > before
    short = Semaphore(redis_client, "manual-short", slots=1, lease=0.2)
    lease = short.acquire(blocking=False)
    wait_until(lambda: short.holders() == 0, timeout=5)
    assert short.renew(lease) is False
    assert lease.lost


def test_release_is_idempotent_and_owner_checked(redis_client):
    sem = Semaphore(redis_client, "owned", slots=1, lease=10)
    lease = sem.acquire(blocking=False)
    stranger = Lease(name="owned", fence=0, lease_seconds=10, acquired_at_ms=0,
                     expires_at_ms=0, _client=redis_client, _keys=[sem.key],
                     _member="not-a-holder 0 0 ")
    assert sem.release(stranger) is False
    assert sem.holders() == 1
    assert sem.release(lease) is True
    assert sem.release(lease) is False
    assert sem.holders() == 0


def test_fencing_numbers_increase(redis_client):
    sem = Semaphore(redis_client, "fenced", slots=3, lease=10)
    fences, held = [], []
    for _ in range(20):
        lease = sem.acquire(blocking=False)
        fences.append(lease.fence)
        held.append(lease)
        if len(held) == 3:  # all released: the idle key is deleted, numbers still rise
            for lease in held:
                sem.release(lease)
            held.clear()
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_blocking_acquire_waits_for_release(redis_client):
    sem = Semaphore(redis_client, "blocking", slots=1, lease=10)
    held = sem.acquire(blocking=False)
    threading.Timer(0.3, sem.release, args=(held,)).start()
    lease = sem.acquire(blocking=True, timeout=5)
    assert lease is not None
    # Admitted only once the holder gave the slot back, 0.3 s or more after it took it
    # (both on the server's clock): it waited, however slow or fast the machine is.
    assert lease.acquired_at_ms - held.acquired_at_ms >= 300 - 1
    assert sem.acquire(blocking=True, timeout=0.2) is None


def test_a_timeout_alone_waits_as_in_threading(redis_client):
    """``acquire(timeout=...)`` waits, as ``threading.Semaphore.acquire(timeout=...)``
    does, without ``blocking=True``; ``blocking=False`` with a timeout is refused."""
    sem = Semaphore(redis_client, "timeout-alone", slots=1, lease=10)
    held = sem.acquire()
    threading.Timer(0.3, sem.release, args=(held,)).start()
    lease = sem.acquire(timeout=5)
    assert lease is not None
    assert lease.acquired_at_ms - held.acquired_at_ms >= 300 - 1
    started = time.monotonic()
    assert sem.acquire(timeout=0.2) is None
    assert time.monotonic() - started >= 0.2
    with pytest.raises(ValueError, match="non-blocking"):
        sem.acquire(blocking=False, timeout=1)


def test_context_manager_holds_and_releases(redis_client):
    sem = Semaphore(redis_client, "context", slots=1, lease=10)
    with sem as lease:
        assert isinstance(lease, Lease)
        assert sem.acquire(blocking=False) is None
        with pytest.raises(LockTimeout), sem.hold(timeout=0.1):
            pass
    assert sem.holders() == 0
    with sem.hold(timeout=1) as lease:
        assert sem.holders() == 1


def test_keys_share_a_cluster_slot_and_are_bounded():
    name = "x" * 5000 + "{evil}"
    semaphore, rate = semaphore_key(name), rate_key(name)
    tag = semaphore[semaphore.index("{") + 1: semaphore.index("}")]
    assert tag == rate[rate.index("{") + 1: rate.index("}")]
    assert len(tag) == 16 and all(c in "0123456789abcdef" for c in tag)
    assert len(semaphore) < 200
    assert semaphore_key("a" * 200 + "1") != semaphore_key("a" * 200 + "2")


def test_script_reloads_after_script_flush(redis_client):
    sem = Semaphore(redis_client, "flushed", slots=1, lease=10)
    sem.release(sem.acquire(blocking=False))
    redis_client.script_flush()
    assert sem.acquire(blocking=False) is not None


@pytest.mark.parametrize("slots", [0, -1, 1.5, "2", True, None])
def test_bad_slots_are_refused(redis_client, slots):
    with pytest.raises(LockConfigurationError, match="slots must be a positive integer"):
        Semaphore(redis_client, "bad", slots=slots)


@pytest.mark.parametrize("lease", [0, -1, "10", None])
def test_bad_lease_is_refused(redis_client, lease):
    with pytest.raises(LockConfigurationError, match="lease must be a positive number"):
        Semaphore(redis_client, "bad", lease=lease)


def test_a_redelivered_run_finds_the_earlier_run_that_still_holds(redis_client):
    from celery_redislock.engine.admission import (
        FREED_AS_LOST,
        SlotLimit,
        admit,
        holder_lease_end,
    )
    from celery_redislock.gate.recovery import free_owner_slots
    from celery_redislock.pool.earlier_run import find_earlier

    limit = SlotLimit("redelivered", 1, "redislock:")
    earlier = admit(redis_client, [limit], lease=10, owner="w1@host|task-7|")
    again = admit(redis_client, [limit], lease=10, owner="w2@host|task-7|")
    found = find_earlier(redis_client, [limit], "task-7", again)
    assert found is not None and found["member"].startswith(earlier.token + " ")
    assert found["until"] == earlier.expires_at_ms and found["name"] == "redelivered"
    assert find_earlier(redis_client, [limit], "task-8", again) is None
    now_ms, lease_end = holder_lease_end(redis_client, found["key"], found["member"])
    assert lease_end == earlier.expires_at_ms and now_ms < lease_end
    earlier.release()
    assert holder_lease_end(redis_client, found["key"], found["member"])[1] == 0
    lost = admit(redis_client, [limit], lease=10, owner="w1@host|task-9|")
    free_owner_slots(None, redis_client, [found["key"]], "w1@host|task-9|", 10)
    member = f"{lost.token} {lost.acquired_at_ms} {lost.fence} "
    assert holder_lease_end(redis_client, found["key"], member)[1] == FREED_AS_LOST


def test_error_replies_are_raised_as_redis_py_exceptions(redis_client):
    """The per-thread channel reads replies itself: an error reply is raised as the
    exception redis-py would raise (here a script error, and NOSCRIPT handled by
    falling back to EVAL), and the connection stays usable."""
    import redis.exceptions

    from celery_redislock.engine.channel import channel_for

    channel = channel_for(redis_client)
    with pytest.raises(redis.exceptions.ResponseError):
        channel.call("EVAL", "return redis.error_reply('boom')", 0)
    with pytest.raises(redis.exceptions.NoScriptError):
        channel.call("EVALSHA", "0" * 40, 0)
    assert channel.call_many(("PING",), ("ECHO", "x")) == [b"PONG", b"x"]


def test_renewal_goes_on_after_the_keeper_meets_an_unexpected_error(redis_client,
                                                                     monkeypatch, caplog):
    from celery_redislock.engine import keeper as keeper_module

    failures = []
    real_settle_all = keeper_module.settle_all

    def settle_all_failing_once(**kwargs):
        if not failures:
            failures.append(True)
            raise RuntimeError("a bug the keeper did not expect")
        real_settle_all(**kwargs)

    monkeypatch.setattr(keeper_module, "settle_all", settle_all_failing_once)
    monkeypatch.setattr(keeper_module, "PAUSE_AFTER_FAILURE", 0.05)
    sem = Semaphore(redis_client, "keeps-going", slots=1, lease=0.5)
    with sem.hold() as lease:
        wait_until(lambda: failures, timeout=5, what="the keeper to meet the error")
        time.sleep(1.6)  # more than 3 leases: only renewal explains still holding it
        assert not lease.lost
        assert sem.holders() == 1
    assert "the lease keeper failed" in caplog.text


def test_available_counts_override_and_pause(redis_client):
    from celery_redislock.admin.control import clear_slots, pause, resume, set_slots

    slots = Semaphore(redis_client, "avail", slots=3, lease=30)
    held = slots.acquire(blocking=False)
    assert slots.available() == 2
    set_slots(redis_client, "avail", 5)
    assert slots.available() == 4                   # the operator's override counts
    clear_slots(redis_client, "avail")
    assert slots.available() == 2
    pause(redis_client, "avail", seconds=30)
    assert slots.available() == 0
    resume(redis_client, "avail")
    assert slots.available() == 2
    slots.release(held)
    assert slots.available() == 3


def test_a_probe_takes_nothing_and_refuses_as_an_admission_does(redis_client):
    """A probe (a worker's main process with no free pool process): admissible, nothing
    is taken, neither a slot nor a rate's start; refused, it is the refusal an admission
    gets, a rate's promise included."""
    from celery_redislock.engine.admission import (
        Busy,
        RateLimit,
        RateLimited,
        SlotLimit,
        WouldAdmit,
        admit,
    )
    from celery_redislock.engine.rate import Rate

    slot = SlotLimit("probed", 1, "redislock:")
    rate = RateLimit("probed", Rate.parse("1/m", burst=0), "redislock:")
    assert isinstance(admit(redis_client, [slot, rate], lease=10, probe=True), WouldAdmit)
    assert redis_client.zcount(slot.key, "(0", "+inf") == 0
    assert not redis_client.hexists(rate.key, "tat")
    lease = admit(redis_client, [slot, rate], lease=10)
    assert isinstance(lease, Lease)
    assert isinstance(admit(redis_client, [slot], lease=10, probe=True), Busy)
    lease.release()
    refused = admit(redis_client, [rate], lease=10, probe=True)
    assert isinstance(refused, RateLimited) and refused.wait > 50
    # The promise was made: a newcomer is promised the start after it.
    later = admit(redis_client, [rate], lease=10)
    assert isinstance(later, RateLimited) and later.promise > refused.promise
