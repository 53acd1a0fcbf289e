"""The GCRA rate limiter against a real redis-server: boundaries, burst, idle, promises."""

from __future__ import annotations

import time

import pytest

from celery_redislock import LockConfigurationError, Rate, RateLimiter
from celery_redislock.admin import control
from celery_redislock.engine.admission import (
    Booked,
    Lease,
    RateLimit,
    RateLimited,
    SlotLimit,
    admit,
)
from celery_redislock.testing import RedisServer


def server_us(client):
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("100/m", 100, 60), ("10/s", 10, 1), ("5/10s", 5, 10), ("3/h", 3, 3600),
     ("2 / 30 sec", 2, 30), ("1/d", 1, 86400), ("0.5/s", 0.5, 1)],
)
def test_rate_strings(text, count, period):
    rate = Rate.parse(text)
    assert (rate.count, rate.period) == (count, period)


@pytest.mark.parametrize("text", ["100", "100/", "/m", "abc/m", "10/fortnight", "0/s", 10, None])
def test_bad_rate_strings_are_refused(text):
    with pytest.raises(LockConfigurationError, match="rate"):
        Rate.parse(text, owner="Task 'x'")


@pytest.mark.parametrize("burst", [-1, 1.5, "2", True])
def test_bad_burst_is_refused(burst):
    with pytest.raises(LockConfigurationError, match="burst must be a whole number"):
        Rate.parse("1/s", burst)


def test_never_seen_key_admits_at_once(redis_client):
    assert RateLimiter(redis_client, "fresh", "1/h").try_acquire()


def test_exact_spacing_at_the_boundary(redis_client):
    limiter = RateLimiter(redis_client, "spaced", "10/s", burst=0)  # one start per 100 ms
    before = server_us(redis_client)
    assert limiter.try_acquire()
    after = server_us(redis_client)
    refused = limiter.attempt()
    assert refused is not None
    assert 0 < refused.wait <= 0.1
    # The refusal promised the next start 100 ms after the first; it is refused until
    # then, and admitted from that time on. Judged by the server's clock around each call
    # (a loaded machine only widens the window, never flips the verdict).
    assert before + 100_000 <= refused.promise <= after + 100_000
    while True:
        asked = server_us(redis_client)
        outcome = limiter.attempt(refused.promise)
        answered = server_us(redis_client)
        if outcome is None:
            assert answered >= refused.promise, "admitted before its promised start"
            break
        assert asked < refused.promise, "refused after its promised start"


def test_burst_admits_back_to_back_then_spaces(redis_client):
    # 30 s between starts: the five calls fall within one interval however slow the
    # machine is, so 1 + burst of them are admitted and the fifth is not.
    limiter = RateLimiter(redis_client, "bursty", "2/m", burst=3)
    assert [limiter.try_acquire() for _ in range(5)] == [True, True, True, True, False]


def test_long_idle_does_not_bank_more_than_the_burst(redis_client):
    """After ten intervals of idleness, three calls within one interval: 1 + burst are
    admitted, not more. Whether the calls fell within one interval is judged on the
    server's clock around them; a sample that a loaded machine spread wider is taken
    again (it proves nothing either way)."""
    limiter = RateLimiter(redis_client, "idle", "20/s", burst=1)  # 50 ms apart
    limiter.try_acquire()
    samples = []
    for _ in range(5):
        time.sleep(0.5)  # ten intervals of idleness
        before = server_us(redis_client)
        outcomes = [limiter.try_acquire() for _ in range(3)]
        if server_us(redis_client) - before < 50_000:
            samples.append(outcomes)
            break
    assert samples, "no three calls fell within 50 ms in five tries"
    assert samples == [[True, True, False]]


def test_newcomers_do_not_overtake_promised_waiters(redis_client):
    limiter = RateLimiter(redis_client, "queue", "5/s", burst=0)  # 200 ms apart
    assert limiter.try_acquire()
    first = limiter.attempt()
    second = limiter.attempt()
    assert second.promise - first.promise == 200_000
    while server_us(redis_client) < first.promise:
        time.sleep(0.005)
    # A newcomer waits behind the promise line, which ends one interval after the second
    # promise (judged on the server's clock, before the call: a loaded machine may ask
    # only once the line has ended, when it is rightly admitted).
    before = server_us(redis_client)
    if limiter.attempt() is None:
        assert before >= second.promise + 200_000, "a newcomer overtook the promise line"
    else:
        assert limiter.attempt(first.promise) is None  # the promised waiter gets its turn


def test_late_runs_whose_starts_were_taken_are_promised_starts_of_their_own(redis_client):
    """Runs that come back late, after early runs took the starts left free, are each
    promised a start at the end of the line: no two of them get the same start, which
    would send them after one start, the one that loses asking again and again."""
    limiter = RateLimiter(redis_client, "late", "2/s", burst=1)  # 500 ms apart
    assert limiter.try_acquire() and limiter.try_acquire()  # the burst
    promises = [limiter.attempt().promise for _ in range(4)]  # +0.5, +1, +1.5, +2 s
    assert [b - a for a, b in zip(promises, promises[1:])] == [500_000] * 3
    # Halfway between the third promise and the fourth (the next 500 ms leave room for
    # the steps below on a slow machine):
    while server_us(redis_client) < promises[1] + 750_000:
        time.sleep(0.005)
    # The third comes back on time and the fourth early: both find the starts free.
    assert limiter.attempt(promises[2]) is None
    assert limiter.attempt(promises[3]) is None
    # The first two come back late: the starts left are taken.
    late = [limiter.attempt(promise) for promise in promises[:2]]
    assert all(refused is not None for refused in late)
    assert late[1].promise - late[0].promise == 500_000
    assert late[0].promise >= promises[3] + 500_000  # behind every promise made before


def test_blocking_acquire_achieves_the_rate(redis_client):
    """Blocking callers start exactly one interval apart on the server's clock, and each
    waits by sleeping until its promised start (one refusal at most), not by polling."""
    limiter = RateLimiter(redis_client, "steady", "50/s", burst=0)  # 20 ms apart
    interval_us = 20_000
    attempts = []
    attempt = limiter.attempt

    def counted(*args, **kwargs):
        attempts[-1] += 1
        return attempt(*args, **kwargs)

    limiter.attempt = counted
    starts = []
    for _ in range(15):
        attempts.append(0)
        assert limiter.acquire(timeout=5)
        # GCRA with no burst: an admission at server time t sets 'tat' to t + interval.
        starts.append(int(redis_client.hget(limiter.limit.key, "tat")) - interval_us)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= interval_us, gaps
    assert max(attempts) <= 2, attempts


def test_acquire_gives_up_after_timeout(redis_client):
    limiter = RateLimiter(redis_client, "slow", "1/m", burst=0)
    assert limiter.try_acquire()
    assert limiter.acquire(timeout=0.1) is False


def test_state_expires_when_idle(redis_client):
    """The state lives a second past the last start it counts (100 ms ahead at 10/s),
    and at most twice that, so that most admissions need no PEXPIRE."""
    limiter = RateLimiter(redis_client, "ttl", "10/s")
    limiter.try_acquire()
    ttl = redis_client.pttl(limiter.limit.key)
    assert 1000 < ttl <= 2 * 1100
    until_ms, tat, _ = redis_client.hget(limiter.limit.key, "exp").split(b" ")
    assert int(until_ms) > 0 and tat == redis_client.hget(limiter.limit.key, "tat")


def test_most_admissions_of_a_busy_rate_set_no_time_to_live():
    """A rate limiter's key keeps its time to live's end in its state: of 100 admissions
    in a row only the first sets it (and then only when it runs short), and together
    they cost at most five commands each in the lock store (its own server, so that
    nothing else is counted)."""
    with RedisServer() as server:
        client = server.client()
        limiter = RateLimiter(client, "busy", "1000/s", burst=200)
        assert limiter.try_acquire()  # the script is loaded
        before = client.info("commandstats")
        assert all(limiter.try_acquire() for _ in range(100))
        after = client.info("commandstats")
        client.close()
    calls = {name[len("cmdstat_"):]: stat["calls"] - before.get(name, {}).get("calls", 0)
             for name, stat in after.items()}
    calls.pop("info", None)
    assert calls.get("evalsha", 0) == 100
    assert calls.get("pexpire", 0) <= 1, calls
    assert sum(calls.values()) <= 5 * 100, calls


def test_slots_and_rate_are_all_or_nothing(redis_client):
    slots = SlotLimit("both", 1, "redislock:")
    rate = RateLimit("both", Rate.parse("1/h", burst=0), "redislock:")
    first = admit(redis_client, [slots, rate], lease=10)
    assert first.fence > 0
    first.release()
    # The rate refuses now: no slot may be left taken by the refused attempt.
    refused = admit(redis_client, [slots, rate], lease=10)
    assert refused.__class__.__name__ == "RateLimited"
    assert redis_client.zcount(slots.key, 0, "+inf") == 0
    # A full semaphore refuses: the rate must not be spent (nor a promise made).
    other_rate = RateLimit("other", Rate.parse("1/h", burst=0), "redislock:")
    held = admit(redis_client, [slots], lease=10)
    busy = admit(redis_client, [slots, other_rate], lease=10)
    assert busy.__class__.__name__ == "Busy"
    assert redis_client.exists(other_rate.key) == 0
    held.release()
    assert admit(redis_client, [slots, other_rate], lease=10).__class__.__name__ == "Lease"


def test_a_paused_name_admits_nobody_until_resumed(redis_client):
    from celery_redislock.admin.control import pause, resume

    limiter = RateLimiter(redis_client, "paused-api", "100/s", burst=5)
    pause(redis_client, "paused-api", seconds=30)
    assert limiter.try_acquire() is False
    assert limiter.acquire(timeout=0.2) is False
    resume(redis_client, "paused-api")
    assert limiter.try_acquire() is True


def test_a_booked_start_is_counted_as_taken_at_its_time(redis_client):
    """``book_ms``: a run that would be promised a start that soon is admitted from it
    (``Booked``), in one call, and the start counts as taken: the next run is booked
    (or promised) one interval later, and a run outside the booking's reach is only
    promised its start."""
    limit = RateLimit("booked", Rate.parse("10/s", burst=0), "redislock:")
    first = admit(redis_client, [limit], lease=5)
    assert isinstance(first, Lease)
    booked = [admit(redis_client, [limit], lease=5, book_ms=500) for _ in range(3)]
    assert [type(outcome) for outcome in booked] == [Booked] * 3
    starts = [first.acquired_at_ms, *(outcome.lease.acquired_at_ms for outcome in booked)]
    assert all(98 <= b - a <= 102 for a, b in zip(starts, starts[1:])), starts
    assert all(outcome.lease.expires_at_ms == outcome.lease.acquired_at_ms + 5000
               for outcome in booked)
    assert 0.2 <= booked[-1].wait <= 0.31
    # The next start is 400 ms away: beyond a 300 ms booking, so only promised.
    later = admit(redis_client, [limit], lease=5, book_ms=300)
    assert isinstance(later, RateLimited)
    assert 399_000 <= later.promise - starts[0] * 1000 <= 401_000


def test_only_a_lone_rate_limit_books(redis_client):
    """A run with a slot limit beside its rate, or probing, is promised its start as
    before: a booked start would hold its slot while it waits."""
    rate = RateLimit("lone", Rate.parse("10/s", burst=0), "redislock:")
    slots = SlotLimit("lone", 5, "redislock:")
    assert isinstance(admit(redis_client, [rate], lease=5), Lease)
    assert isinstance(admit(redis_client, [slots, rate], lease=5, book_ms=500), RateLimited)
    assert isinstance(admit(redis_client, [rate], lease=5, book_ms=500, probe=True),
                      RateLimited)


def test_a_booked_start_given_back_leaves_the_rate_as_it_was(redis_client):
    """A booked start its run cannot take on time is given back (one script): the
    rate limiter's count moves back by one interval."""
    limit = RateLimit("given-back", Rate.parse("10/s", burst=0), "redislock:")
    admit(redis_client, [limit], lease=5)
    before = int(redis_client.hget(limit.key, "tat"))
    booked = admit(redis_client, [limit], lease=5, book_ms=500)
    assert isinstance(booked, Booked)
    # (A promised start's last digit, in µs, is the number of its rate's plan.)
    assert 0 <= int(redis_client.hget(limit.key, "tat")) - (before + 100_000) < 10
    assert booked.give_back()
    assert 0 <= int(redis_client.hget(limit.key, "tat")) - before < 10


def test_booked_starts_never_crowd_a_window(redis_client):
    """Runs booked back to back, with newcomers promised between them, get starts one
    interval apart: no window of a period holds more than the rate and its burst."""
    limit = RateLimit("crowd", Rate.parse("20/s", burst=2), "redislock:")
    starts = []
    for index in range(30):
        outcome = admit(redis_client, [limit], lease=5, book_ms=60_000)
        if isinstance(outcome, Lease):
            starts.append(outcome.acquired_at_ms)
        else:
            assert isinstance(outcome, Booked)
            starts.append(outcome.lease.acquired_at_ms)
        if index % 5 == 4:
            promised = admit(redis_client, [limit], lease=5)
            assert isinstance(promised, RateLimited)
            starts.append(promised.promise // 1000)
    starts.sort()
    most = max(sum(1 for t in starts if s <= t < s + 1000) for s in starts)
    assert most <= 20 + 2, starts


def test_a_run_back_early_books_its_promise_only_when_it_is_next(redis_client):
    """A run that comes back before the start it was promised books it only when no
    start promised before it is still due: out of turn it keeps its promise (and asks
    again), so that booking never takes an earlier run's start."""
    limit = RateLimit("back-early", Rate.parse("10/s", burst=0), "redislock:")
    assert isinstance(admit(redis_client, [limit], lease=5), Lease)
    first, second = (admit(redis_client, [limit], lease=5) for _ in range(2))
    assert isinstance(first, RateLimited) and isinstance(second, RateLimited)
    out_of_turn = admit(redis_client, [limit], lease=5, book_ms=500,
                        promises={limit.key: second.promise})
    assert isinstance(out_of_turn, RateLimited) and out_of_turn.promise == second.promise
    in_turn = [admit(redis_client, [limit], lease=5, book_ms=500,
                     promises={limit.key: outcome.promise}) for outcome in (first, second)]
    assert [type(outcome) for outcome in in_turn] == [Booked, Booked]
    assert [outcome.lease.acquired_at_ms for outcome in in_turn] == [
        first.promise // 1000, second.promise // 1000]


def test_a_state_someone_else_wrote_gets_its_time_to_live_set_again(redis_client):
    """The end of the time to live kept in the state is trusted only while nobody else
    wrote the state: after a write by someone else (an earlier version of the package,
    which sets the time to live to what its own view needs), the next admission sets it
    again, so the key outlives every start it counts or promised."""
    limit = RateLimit("written-by-others", Rate.parse("1/s", burst=0), "redislock:")
    assert isinstance(admit(redis_client, [limit], lease=5), Lease)
    for _ in range(3):  # three starts promised: the time to live is set some 10 s ahead
        assert isinstance(admit(redis_client, [limit], lease=5), RateLimited)
    tat = int(redis_client.hget(limit.key, "tat"))
    redis_client.hset(limit.key, "tat", str(tat + 1_000_000))  # a start taken elsewhere
    redis_client.pexpire(limit.key, 1_500)
    promised = admit(redis_client, [limit], lease=5)
    assert isinstance(promised, RateLimited) and promised.wait > 3.5
    # The line now ends a second after that promise: the key lives at least that long,
    # and a second more.
    assert redis_client.pttl(limit.key) > (promised.wait + 2) * 1000


def test_a_booked_start_is_given_back_only_while_it_is_the_last_counted(redis_client):
    """Once a later start is counted, giving an earlier booked start back would let a
    new start come closer than the rate allows to that later one: it is left unused."""
    limit = RateLimit("given-back-late", Rate.parse("10/s", burst=0), "redislock:")
    admit(redis_client, [limit], lease=5)
    first, second = (admit(redis_client, [limit], lease=5, book_ms=500) for _ in range(2))
    assert isinstance(first, Booked) and isinstance(second, Booked)
    counted = redis_client.hget(limit.key, "tat")
    assert not first.give_back()
    assert redis_client.hget(limit.key, "tat") == counted
    assert second.give_back()  # the last counted: given back
    assert first.give_back() is True  # now the last again



def test_a_booked_start_given_back_under_a_raised_rate_gives_back_what_it_took(redis_client):
    """A rate raised at run time (set-rate 4/s -> 20/s): a booked start counts one interval
    of the new rate, and giving it back takes out that much, not the configured
    interval: else the count would fall behind the start counted before it, and the next
    run would start at once, closer to it than the rate allows."""
    limit = RateLimit("given-back-raised", Rate.parse("4/s", burst=0), "redislock:")
    control.set_rate(redis_client, "given-back-raised", "20/s")
    assert isinstance(admit(redis_client, [limit], lease=5), Lease)
    before = int(redis_client.hget(limit.key, "tat"))
    booked = admit(redis_client, [limit], lease=5, book_ms=500)
    assert isinstance(booked, Booked)
    assert 0 <= int(redis_client.hget(limit.key, "tat")) - (before + 50_000) < 10
    assert booked.give_back()
    assert 0 <= int(redis_client.hget(limit.key, "tat")) - before < 10
    assert isinstance(admit(redis_client, [limit], lease=5), RateLimited)


def test_a_booked_start_given_back_under_a_lowered_rate_never_gives_back_more(redis_client):
    """A rate lowered at run time (20/s -> 4/s), then a booked start given back: the
    count never moves back past the start counted before it (the smaller of the two
    intervals is given back: the booking may have been counted before the change)."""
    limit = RateLimit("given-back-lowered", Rate.parse("20/s", burst=0), "redislock:")
    control.set_rate(redis_client, "given-back-lowered", "4/s")
    assert isinstance(admit(redis_client, [limit], lease=5), Lease)
    before = int(redis_client.hget(limit.key, "tat"))
    booked = admit(redis_client, [limit], lease=5, book_ms=500)
    assert isinstance(booked, Booked)
    assert booked.give_back()
    assert int(redis_client.hget(limit.key, "tat")) >= before
