"""The engine against a model of it: hypothesis stateful tests on a real redis-server.

The semaphore
-------------
:class:`EngineModel` drives one semaphore (1 to 4 slots) through acquisitions (some of
them weighted: a run of cost k takes k slots at once, as k members), releases,
renewals and the passage of time, and after every step compares Redis with a model that
only knows, for each lease ever handed out, whether it is live, ran out (its entry still
in the sorted set), or gone (no entry).

Time is not waited for. A holder's score in the sorted set is the end of its lease (ms on
the server's clock), and the engine only ever compares scores with the server's current
time; so lowering a score by ``d`` ms is, for the engine, exactly ``d`` ms passing without
a renewal. Two rules move lease ends that way:

* ``time_passes`` moves every lease end back by whole ticks of 10 s (leases are 30 s), and
  shortens the key's time to live (PTTL) as much, deleting the key if that runs out: a
  lease runs out after three ticks without a renewal, an idle semaphore's key after its
  statistics' minute. The few milliseconds of real time the test takes stay far from the
  tick edges, so the model knows which leases are live.
* ``holder_stalls`` moves one lease end to just before the server's current time: that
  holder stalled (a paused process) until its lease ran out.

Releases that do not wait for their reply (``Lease.release_soon``, as a worker's runs
release; also those left to be written with the next request) are followed by one call
on the same per-thread connection, which writes them if need be and reads that reply:
Redis has applied them before the state is compared.

The rate limiter
----------------
GCRA is checked on real time, at a fast rate, through :func:`admit` (which tells the
server time, in ms, of each admission): however callers interleave, no window of one
period holds more than ``count + burst`` admissions.
"""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Optional

import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from celery_redislock import Busy, Lease, Rate, RateLimited, RateLimiter, Semaphore
from celery_redislock.engine.admission import RateLimit, SlotLimit, admit
from celery_redislock.engine.channel import channel_for
from celery_redislock.engine.holder import unit_members

LEASE = 30.0
LEASE_MS = 30_000
TICK_MS = 10_000  # one step of simulated time
LEASE_TICKS = LEASE_MS // TICK_MS  # a lease not renewed for this many ticks has ended

LIVE, ENDED, GONE = "live", "ended", "gone"
STATISTICS = {"#fence", "#hold", "#slots", "#ttl"}


# Moves time forward by ARGV[1] ms for one semaphore: its lease ends and its expiry (and
# the record of its expiry).
# Returns 1 if the key expired meanwhile (and deletes it), else 0.
PASS_TIME = """
local key, elapsed = KEYS[1], tonumber(ARGV[1])
local entries = redis.call('ZRANGEBYSCORE', key, 0, '+inf', 'WITHSCORES')
for i = 1, #entries, 2 do
  redis.call('ZADD', key, 'XX', tonumber(entries[i + 1]) - elapsed, entries[i])
end
local recorded = redis.call('ZSCORE', key, '#ttl')  -- minus when its expiry comes
if recorded then redis.call('ZADD', key, tonumber(recorded) + elapsed, '#ttl') end
local ttl = redis.call('PTTL', key)
if ttl > elapsed then
  redis.call('PEXPIRE', key, ttl - elapsed)
elseif ttl >= 0 then
  redis.call('DEL', key)
  return 1
end
return 0
"""


class PlainRedis(redis.Redis):
    """Not exactly ``redis.Redis``: the package calls it the ordinary way, through its pool,
    instead of over its per-thread channel."""


@dataclass(eq=False)
class Held:
    """The model of one admitted lease."""

    lease: Lease
    state: str = LIVE
    age: int = 0  # ticks of simulated time since it was taken or last renewed
    cost: int = 1  # slots it takes: its entry, and units "<token>*2"... beside it

    @property
    def member(self) -> str:
        return self.lease._member

    @property
    def members(self) -> list:
        return [self.member, *unit_members(self.lease.token, self.cost)]


def server_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class EngineModel(RuleBasedStateMachine):
    """One semaphore, two clients (channel and plain), against the model."""

    clients: tuple = ()  # (redis.Redis, PlainRedis) on the same server, set per test

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.sems: list = []
        self.slots = 0
        self.held: list[Held] = []
        self.last_fence = 0
        self.refused = False  # a run was refused: admissions from now on are "contended"
        self.average_known = False  # a contended holder was released: Busy has an average

    # -- set-up --------------------------------------------------------------------------

    @initialize(slots=st.integers(1, 4))
    def open_semaphore(self, slots):
        self.slots = slots
        name = f"model-{uuid.uuid4().hex}"
        self.sems = [Semaphore(client, name, slots=slots, lease=LEASE) for client in self.clients]
        self.client = self.clients[0]
        self.key = self.sems[0].key

    def teardown(self) -> None:
        if self.sems:
            self.client.delete(self.key)

    # -- helpers -------------------------------------------------------------------------

    def live(self) -> list[Held]:
        return [held for held in self.held if held.state == LIVE]

    def used(self) -> int:
        return sum(held.cost for held in self.live())

    def settle(self, lease: Lease) -> None:
        """Make sure a release sent without waiting has reached Redis, and its reply was
        read."""
        channel = channel_for(lease._client)
        if channel is not None:
            assert channel.call("PING") in (True, b"PONG", "PONG")
            assert not channel.unsettled

    def move_lease_ends(self, members_and_ends) -> None:
        if members_and_ends:
            self.client.zadd(self.key, dict(members_and_ends), xx=True)

    # -- rules ---------------------------------------------------------------------------

    @rule(target=leases, side=st.sampled_from([0, 1]), blocking_api=st.booleans(),
          cost=st.sampled_from([1, 1, 2, 3, 4]))
    def acquire(self, side, blocking_api, cost=1):
        """A plain acquisition, or a weighted run's (``cost`` slots at once, capped at the
        slots), through either client."""
        sem = self.sems[side]
        cost = min(cost, self.slots)
        live = self.used()
        if cost > 1:
            blocking_api = False
            outcome = admit(sem.client, [SlotLimit(sem.name, self.slots, sem.limit.prefix,
                                                   cost)], lease=LEASE)
        else:
            outcome = sem.acquire(blocking=False) if blocking_api else sem.attempt()
        # Admitted or refused, an admission tidies away every lease that had run out.
        for held in self.held:
            if held.state == ENDED:
                held.state = GONE
        if live + cost <= self.slots:
            assert isinstance(outcome, Lease), (
                f"cost {cost} refused with {live} of {self.slots} taken")
            assert outcome.costs == [cost]
            assert outcome.fence > self.last_fence, "fencing numbers must rise"
            assert outcome._member.split(" ")[2] == str(outcome.fence)
            assert outcome.expires_at_ms - outcome.acquired_at_ms == LEASE_MS
            assert outcome.holds_slots and outcome.name == sem.name
            assert outcome._contended == self.refused
            assert all(held.lease.token != outcome.token for held in self.held)
            self.last_fence = outcome.fence
            held = Held(outcome, cost=cost)
            self.held.append(held)
            return multiple(held)
        event(f"refused: cost {cost}, {live} of {self.slots} slot(s) taken")
        if blocking_api:
            assert outcome is None
        else:
            assert isinstance(outcome, Busy)
            assert outcome.holders == live and outcome.slots == self.slots
            oldest = max(held.age for held in self.live())
            first_end = (LEASE_TICKS - oldest) * TICK_MS / 1000
            assert first_end - 5 < outcome.retry_hint <= first_end
            assert (outcome.average_hold is not None) == self.average_known
        self.refused = True
        return multiple()

    @rule(held=leases, how=st.sampled_from(["semaphore", "lease", "soon", "with next"]))
    def release(self, held, how):
        lease = held.lease
        if how == "semaphore":
            released = self.sems[0].release(lease)
        elif how == "lease" or lease._contended:
            # (release_soon waits for the answer of a contended lease, as release does;
            # tests/test_channel.py checks that.)
            released = lease.release()
        else:
            handed = []
            lease.release_soon(handed.extend, with_next_request=how == "with next")
            self.settle(lease)
            assert handed == [], "these semaphores never have a waiting line"
            released = None  # not told: a worker's run does not ask
        # A holder admitted once the semaphore had refused a run is timed when released.
        if held.state == LIVE:
            assert released in (True, None)
            if lease._contended:
                self.average_known = True
        elif held.state == GONE:
            assert released in (False, None), "released a lease it no longer held"
        else:
            # Ran out, and nobody was admitted since (an admission tidies it away): the
            # slot was never given to anyone else, so True is allowed; either way the
            # removal of the stale entry frees no live slot, which the invariant checks.
            if released and lease._contended:
                self.average_known = True
        event(f"release of a {held.state} lease")
        held.state = GONE

    @rule(held=leases, through_semaphore=st.booleans())
    def renew(self, held, through_semaphore):
        lease = held.lease
        before = lease.expires_at_ms
        renewed = self.sems[1].renew(lease) if through_semaphore else lease.renew()
        event(f"renewal of a {held.state} lease")
        if held.state == LIVE:
            assert renewed is True and not lease.lost
            assert lease.expires_at_ms >= before
            held.age = 0
        else:
            assert renewed is False and lease.lost, "a lease that had ended was revived"
            held.state = GONE

    @rule(held=leases)
    def holder_stalls(self, held):
        """Stands for time passing for one holder: its lease runs out now."""
        now = server_ms(self.client)
        self.move_lease_ends([(member, now - 1) for member in held.members])
        if held.state == LIVE:
            held.state = ENDED

    @rule(ticks=st.integers(1, LEASE_TICKS) | st.just(2 * LEASE_TICKS))
    def time_passes(self, ticks):
        """Stands for ``ticks`` x 10 s passing with no renewal: every lease end, and the
        key's own expiry, moves back by that much."""
        key_expired = self.client.eval(PASS_TIME, 1, self.key, ticks * TICK_MS)
        for held in self.live():
            held.age += ticks
            if held.age >= LEASE_TICKS:
                held.state = ENDED
        if key_expired:
            event("the idle semaphore's key expired")
            assert not self.live(), "the key expired under a live lease"
            for held in self.held:
                held.state = GONE
            self.refused = self.average_known = False

    @rule(target=leases)
    def every_lease_ends_then_all_slots_refill(self):
        """A slot is never lost: once every lease has run out, all slots can be taken."""
        self.time_passes(LEASE_TICKS)
        taken = [self.acquire(side % 2, False).values[0] for side in range(self.slots)]
        assert len(self.live()) == self.slots
        assert self.sems[1].acquire(blocking=False) is None
        self.refused = True
        for held in self.held:
            if held.state == ENDED:
                held.state = GONE
        return multiple(*taken)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def redis_matches_the_model(self):
        if not self.sems:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.time().zrange(self.key, 0, -1, withscores=True).pttl(self.key)
        (seconds, micros), entries, ttl = pipe.execute()
        now = int(seconds) * 1000 + int(micros) // 1000
        entries = {member.decode(): score for member, score in entries}
        holders = {member: end for member, end in entries.items() if member not in STATISTICS}
        assert set(entries) - set(holders) <= STATISTICS
        assert all(end >= 0 for end in holders.values())
        live = {member for member, end in holders.items() if end > now}

        assert set(holders) == {member for held in self.held if held.state != GONE
                                for member in held.members}
        assert live == {member for held in self.live() for member in held.members}
        assert len(live) <= self.slots
        assert self.sems[1].holders() == len(live)
        if "#fence" in entries:
            assert -entries["#fence"] == self.last_fence
        if entries:
            # The key must outlive its last lease, and never live forever.
            assert ttl > 0
            assert "#fence" in entries
            assert ttl >= max((holders[m] for m in live), default=now) - now - 2


ENGINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_semaphore_follows_its_model(redis_server, redis_client):
    plain = PlainRedis(host="127.0.0.1", port=redis_server.port)
    machine = type("EngineModelHere", (EngineModel,), {"clients": (redis_client, plain)})
    try:
        run_state_machine_as_test(machine, settings=ENGINE_SETTINGS)
    finally:
        plain.close()


def test_release_after_lease_ran_out_says_so(redis_client):
    """``Semaphore.release`` returns False for a lease that ran out and was replaced:
    here another holder was admitted in its place, so the stalled holder must not be told
    its release found the slot held."""
    sem = Semaphore(redis_client, "stalled", slots=1, lease=LEASE)
    stalled = sem.acquire(blocking=False)
    redis_client.zadd(sem.key, {stalled._member: server_ms(redis_client) - 1}, xx=True)
    successor = sem.acquire(blocking=False)
    assert successor is not None and successor.fence > stalled.fence
    assert sem.release(stalled) is False
    assert sem.holders() == 1


# -- the rate limiter -----------------------------------------------------------------------


def take_turn(client, limit, deadline):
    """Like ``RateLimiter.acquire``, through :func:`admit`, which tells the admission's
    server time (ms). None if not admitted before ``deadline`` (monotonic seconds)."""
    promise = None
    while True:
        outcome = admit(client, [limit], lease=1,
                        promises={limit.key: promise} if promise else None)
        if isinstance(outcome, Lease):
            return outcome.acquired_at_ms
        assert isinstance(outcome, RateLimited)
        promise = outcome.promise
        if time.monotonic() > deadline:
            return None
        time.sleep(max(outcome.wait, 0.001))


def most_in_one_period(times_ms, period_ms):
    """The most admissions, among times in whole ms (the server clock, floored), that surely
    fell within one period: times less than ``period_ms - 1`` apart, whose true times
    differ by less than ``period_ms`` whatever their sub-millisecond parts."""
    times_ms = sorted(times_ms)
    return max(
        bisect.bisect_left(times_ms, start + period_ms - 1) - index
        for index, start in enumerate(times_ms)
    )


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(2, 8),
    burst=st.integers(0, 3),
    callers=st.integers(1, 4),
    turns=st.integers(2, 6),
    newcomer_polls=st.integers(0, 3),
)
def test_rate_limiter_never_exceeds_rate_plus_burst(
    redis_server, count, burst, callers, turns, newcomer_polls
):
    """Callers waiting their turn in threads: in no window of one period more than
    ``count + burst`` starts, and every caller gets all its turns."""
    period_ms = 50
    rate = Rate.parse(f"{count}/0.05s", burst)
    limit = RateLimit(f"model-rate-{uuid.uuid4().hex}", rate, "redislock:")
    clients = [redis_server.client() for _ in range(callers + 1)]
    admitted: list = []
    guard = threading.Lock()
    deadline = time.monotonic() + 20

    def caller(client):
        for _ in range(turns):
            at = take_turn(client, limit, deadline)
            with guard:
                admitted.append(at)

    def newcomer(client):
        # Callers that try once and give up (as try_acquire does): they may only slow the
        # others down.
        for _ in range(newcomer_polls):
            outcome = admit(client, [limit], lease=1)
            if isinstance(outcome, Lease):
                with guard:
                    admitted.append(outcome.acquired_at_ms)
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(client,)) for client in clients[1:]]
    threads.append(threading.Thread(target=newcomer, args=(clients[0],)))
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        clients[0].delete(limit.key)
        for client in clients:
            client.close()
    assert None not in admitted, "a waiting caller never got its turn"
    assert len(admitted) >= callers * turns
    assert most_in_one_period(admitted, period_ms) <= count + burst


def test_polling_try_acquire_is_admitted_at_the_rate(redis_client):
    """A caller polling ``try_acquire`` faster than the rate gets the rate: a caller that
    will not wait is promised nothing, so its refusals do not push the line of promised
    starts ahead of time. Judged on the server's clock around each call, so it holds
    however slowly the machine polls: every poll that began once a start was allowed is
    admitted, refusals never move the allowed time, and admissions keep the rate."""
    limiter = RateLimiter(redis_client, "polled", "20/s")  # a start every 50 ms
    interval_us = 50_000

    def server_us() -> int:
        seconds, micros = redis_client.time()
        return seconds * 1_000_000 + micros

    allowed_at: Optional[int] = None  # the start time the last refusal told (µs)
    admissions, refusals = [], 0
    while len(admissions) < 8:
        before = server_us()
        refused = limiter.attempt(will_wait=False)
        after = server_us()
        if refused is None:
            admissions.append((before, after))
            allowed_at = None  # not known until the next refusal tells it
        else:
            refusals += 1
            if allowed_at is not None:
                assert before < allowed_at, "refused though the poll began once allowed"
                assert refused.promise == allowed_at, "a refusal moved the allowed start"
            allowed_at = refused.promise
        time.sleep(0.005)
    assert refusals > 0  # it did poll faster than the rate
    # At most 1 + burst starts at once, then one per interval (server clock).
    first_before, last_after = admissions[0][0], admissions[-1][1]
    assert last_after - first_before >= (len(admissions) - 2) * interval_us
