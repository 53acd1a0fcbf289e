"""The wait header as a type (WaitingRun), the decision after an admission (decide) and
how a refused run is sent back (plan_wait): pure code, no Redis, no worker."""

from __future__ import annotations

import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_redislock.config.retry import RetryPolicy
from celery_redislock.engine.admission import (
    Booked,
    Busy,
    Lease,
    ParkRef,
    Paused,
    RateLimited,
    Served,
    WouldAdmit,
)
from celery_redislock.line.waiting import GiveUp, SendBackPlan, plan_wait
from celery_redislock.run.decide import (
    ROOM_POLL,
    End,
    Hold,
    Park,
    Run,
    SendBack,
    Situation,
    WaitHere,
    decide,
)
from celery_redislock.run.waiting_run import (
    NOT_WAITING,
    WAIT_HEADER,
    WaitingRun,
    carries_wait,
    without_wait,
)

# --- WaitingRun ------------------------------------------------------------------------

#: Headers as this package writes them, each with the run read back.
WRITTEN = [
    ({"since": 1700000000000, "attempts": 1, "promises": {}},
     WaitingRun(since=1700000000000, attempts=1, carried=True)),
    ({"since": None, "attempts": 3, "promises": {"rk": 5_000_000}},
     WaitingRun(attempts=3, promises={"rk": 5_000_000}, carried=True)),
    ({"since": 5, "attempts": 1, "promises": {},
      "follows": {"key": "s", "name": "n", "member": "m", "since": 4, "until": 9}},
     WaitingRun(since=5, attempts=1, carried=True,
                follows={"key": "s", "name": "n", "member": "m", "since": 4, "until": 9})),
    # version 2: a copy parked on the parking line (redislock_line = "broker")
    ({"since": 5, "attempts": 1, "promises": {}, "v": 2, "park_id": "17:3", "line": "k"},
     WaitingRun(since=5, attempts=1, park_id="17:3", line="k", carried=True)),
]


def test_a_version_1_header_reads_as_a_run_never_parked():
    """An older worker's header (the retired line's ticket and copy in it): read as a run
    never parked; its old fields are not written back."""
    run = WaitingRun.parse({"since": 5, "attempts": 2, "promises": {}, "ticket": "id.ab",
                            "copy": "c1", "express": True})
    assert not run.parked and run.park_id == "" and run.line == ""
    assert run.header() == {"since": 5, "attempts": 2, "promises": {}}
    assert WaitingRun.parse({"v": 2, "park_id": "17:3", "line": "k"}).parked
    assert not WaitingRun.parse({"v": 2, "park_id": 7, "line": ["k"]}).parked


@pytest.mark.parametrize("header, run", WRITTEN)
def test_a_written_header_reads_back_and_writes_again_the_same(header, run):
    assert WaitingRun.parse(header) == run
    assert run.header() == header
    assert WaitingRun.of(types.SimpleNamespace(headers={WAIT_HEADER: header})) == run


@pytest.mark.parametrize("headers", [None, {}, {"other": 1}, {WAIT_HEADER: None},
                                     {WAIT_HEADER: {}}, {WAIT_HEADER: "text"},
                                     {WAIT_HEADER: [1, 2]}, {WAIT_HEADER: 7}, "not headers"])
def test_no_wait_reads_as_a_run_that_has_not_waited(headers):
    assert WaitingRun.of_headers(headers) == NOT_WAITING
    assert not NOT_WAITING.carried


#: Malformed fields, each read as its default (what today's readers made of a missing one).
MALFORMED = [
    ({"since": "yesterday"}, "since", None),
    ({"since": True}, "since", None),
    ({"since": float("nan")}, "since", None),
    ({"since": 0}, "since", None),
    ({"since": 12.7}, "since", 12),
    ({"attempts": "x"}, "attempts", 0),
    ({"attempts": None}, "attempts", 0),
    ({"attempts": float("inf")}, "attempts", 0),
    ({"attempts": [1]}, "attempts", 0),
    ({"attempts": "4"}, "attempts", 4),  # as int() read it before
    ({"promises": 5}, "promises", {}),
    ({"promises": ["k", 1]}, "promises", {}),
    ({"promises": {"k": "soon", "j": 3, "b": True, "n": float("nan")}}, "promises", {"j": 3}),
    ({"park_id": 12}, "park_id", ""),
    ({"line": {"x": 1}}, "line", ""),
    ({"follows": "abc"}, "follows", None),
    ({"follows": {"key": "s"}}, "follows", None),  # no member, no until: nothing to look at
    ({"follows": {"key": "s", "member": "m", "until": "later"}}, "follows", None),
    ({"follows": {"key": "s", "member": "m", "until": 9, "x": object()}}, "follows",
     {"key": "s", "member": "m", "until": 9}),
]


@pytest.mark.parametrize("header, name, value", MALFORMED)
def test_a_malformed_field_reads_as_its_default(header, name, value):
    run = WaitingRun.parse(header)
    assert getattr(run, name) == value
    assert run.carried


def test_presence_and_removal_of_the_header():
    assert carries_wait({WAIT_HEADER: None}) and not carries_wait({"x": 1})
    assert not carries_wait(None) and not carries_wait(["redislock_wait"])
    headers = {"a": 1, WAIT_HEADER: {"attempts": 1}}
    assert without_wait(headers) == {"a": 1} and WAIT_HEADER in headers
    plain = {"a": 1}
    assert without_wait(plain) is plain and without_wait(None) is None


def test_writing_keeps_the_other_headers():
    run = WaitingRun(attempts=2, park_id="7:1", line="k")
    headers = run.on({"x": 1, WAIT_HEADER: {"attempts": 9}})
    assert headers == {"x": 1, WAIT_HEADER: run.header()}
    request = types.SimpleNamespace(headers={"x": 1})
    run.but(follows=None).put_on(request)
    assert WaitingRun.of(request) == run.but(follows=None)


PLAIN = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5))
VALUES = st.recursive(PLAIN, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
FIELDS = st.sampled_from(["since", "attempts", "promises", "ticket", "copy", "express",
                          "follows", "other"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(VALUES, st.dictionaries(FIELDS, VALUES, max_size=8)))
def test_any_header_reads_without_error_and_round_trips(value: Any):
    """Whatever the broker carries, reading never fails, and what is written back reads
    as the same run (only plain, JSON-able values)."""
    run = WaitingRun.parse(value)
    again = WaitingRun.parse(run.header())
    assert again == (run if run.carried else again)
    assert again.since == run.since and again.attempts == run.attempts
    assert dict(again.promises) == dict(run.promises) and again.follows == run.follows
    assert isinstance(run.attempts, int) and isinstance(run.park_id, str)


# --- decide ----------------------------------------------------------------------------

def busy(**changes: Any) -> Busy:
    return Busy(**{"name": "b", "holders": 1, "slots": 1, "retry_hint": 0.5,
                   "average_hold": None, "server_time_ms": 1, "key": "bk", **changes})


def rate(wait: float, **changes: Any) -> RateLimited:
    return RateLimited(**{"name": "r", "key": "rk", "promise": 42, "wait": wait,
                          "server_time_ms": 1, **changes})


LEASE = Lease.__new__(Lease)  # an admitted outcome: decide only looks at its type
BOOKED = Booked(lease=LEASE, key="rk", interval_us=100.0, wait=0.3, server_time_ms=1)
PAUSED = Paused(name="p", key="pk", retry_hint=None, server_time_ms=1)
SERVED = Served(name="s", server_time_ms=1)

MAIN = Situation()
EAGER = Situation(eager=True)
NO_HOLD = Situation(may_hold=False)
AGAIN = Situation(redelivered=True)

TABLE = [
    # (outcome, situation, action)
    (LEASE, MAIN, Run(LEASE)),
    (LEASE, EAGER, Run(LEASE)),
    (LEASE, AGAIN, Run(LEASE, look_for_earlier=True)),
    (LEASE, Situation(eager=True, redelivered=True), Run(LEASE)),
    (WouldAdmit(server_time_ms=1), MAIN, Hold(ROOM_POLL, probed=True)),
    (WouldAdmit(server_time_ms=1), AGAIN, Hold(ROOM_POLL, probed=True)),
    (BOOKED, AGAIN, Hold(0.3, booked=BOOKED)),
    (SERVED, AGAIN, End("served", "s")),
    (SERVED, EAGER, End("served", "s")),
    (busy(), AGAIN, SendBack(busy(), look_for_earlier=True)),
    (busy(), EAGER, WaitHere(busy())),
    (PAUSED, MAIN, SendBack(PAUSED)),
    (PAUSED, EAGER, WaitHere(PAUSED)),
    (None, MAIN, SendBack(None)),
    (None, AGAIN, SendBack(None)),  # nothing to look at without an answer
    (rate(0.2), MAIN, Hold(0.2, promise=("rk", 42))),
    (rate(0.5), MAIN, Hold(0.5, promise=("rk", 42))),
    (rate(0.2), AGAIN, Hold(0.2, promise=("rk", 42), look_for_earlier=True)),
    (rate(0.51), MAIN, SendBack(rate(0.51))),
    (rate(0.2), Situation(short_wait=0.1), SendBack(rate(0.2))),
    (rate(0.2), NO_HOLD, SendBack(rate(0.2))),
    (rate(0.2), EAGER, WaitHere(rate(0.2))),
    # the parking line: a refusal that wrote the run's reference parks it
    (busy(park=ParkRef("bk", "9:1")), MAIN, Park(ParkRef("bk", "9:1"), "b")),
    (busy(park=ParkRef("bk", "9:1")), AGAIN, Park(ParkRef("bk", "9:1"), "b")),
    (busy(park=ParkRef("bk", "9:1")), EAGER, WaitHere(busy(park=ParkRef("bk", "9:1")))),
]


@pytest.mark.parametrize("outcome, situation, action", TABLE)
def test_decide(outcome, situation, action):
    assert decide(outcome, situation) == action


OUTCOMES = st.one_of(
    st.just(LEASE), st.just(SERVED), st.just(PAUSED), st.just(BOOKED), st.none(),
    st.builds(WouldAdmit, server_time_ms=st.integers(0, 10)),
    st.builds(busy),
    st.builds(busy, park=st.builds(ParkRef, st.just("bk"), st.text(max_size=3))),
    st.builds(rate, st.floats(0, 5)),
)
SITUATIONS = st.builds(Situation, eager=st.booleans(), may_hold=st.booleans(),
                       short_wait=st.floats(0, 1), redelivered=st.booleans())


@settings(max_examples=300, deadline=None)
@given(OUTCOMES, SITUATIONS)
def test_decide_never_runs_a_refused_run_nor_drops_a_run(outcome, situation):
    """Only an admission runs; a run is ended only as served; a refused worker
    run goes back (or is held), an eager one waits in place; a hold is never longer than
    the short wait, except the probe's and a booking's."""
    action = decide(outcome, situation)
    assert isinstance(action, Run) == isinstance(outcome, Lease)
    if isinstance(action, End):
        assert isinstance(outcome, Served)
    if isinstance(action, WaitHere):
        assert situation.eager
    if isinstance(action, SendBack):
        assert not situation.eager and action.refusal is outcome
        assert getattr(outcome, "park", None) is None
    if isinstance(action, Park):
        assert not situation.eager and action.ref is outcome.park
    if isinstance(action, Hold) and action.promise is not None:
        assert situation.may_hold and action.seconds <= situation.short_wait
    if getattr(action, "look_for_earlier", False):
        assert situation.redelivered and not situation.eager


# --- plan_wait: how a refused run is sent back, or gives up ----------------------------

POLICY = RetryPolicy(backoff=1.0, backoff_max=60.0, jitter=False, max_wait=5.0)
UNBOUNDED = RetryPolicy(backoff=1.0, backoff_max=60.0, jitter=False)
NOW = 10_000


def at_now(**changes: Any) -> Busy:
    return busy(**{"server_time_ms": NOW, **changes})


PLANS = [
    # (run, refusal, policy, plan)
    (NOT_WAITING, at_now(), POLICY, SendBackPlan(0.5, NOW, {})),
    (WaitingRun(since=9_000, carried=True), at_now(), POLICY, SendBackPlan(0.5, 9_000, {})),
    (WaitingRun(since=5_200, carried=True), at_now(), POLICY,  # 0.2 s left
     SendBackPlan(pytest.approx(0.2), 5_200, {})),
    (WaitingRun(since=5_000, carried=True), at_now(), POLICY, GiveUp(5.0, 0.0, 5.0)),
    (WaitingRun(since=4_000, carried=True), at_now(), UNBOUNDED,
     SendBackPlan(0.5, 4_000, {})),
    (NOT_WAITING, rate(3.0, server_time_ms=NOW), POLICY, SendBackPlan(1.0, NOW, {"rk": 42})),
    (NOT_WAITING, rate(6.0, server_time_ms=NOW), POLICY, GiveUp(0.0, 6.0, 5.0)),
    (WaitingRun(since=7_000, carried=True), None, POLICY,  # no answer: no clock
     SendBackPlan(1.0, 7_000, {})),
    (NOT_WAITING, None, POLICY, SendBackPlan(1.0, None, {})),
]


@pytest.mark.parametrize("run, refusal, policy, plan", PLANS)
def test_plan_wait(run, refusal, policy, plan):
    assert plan_wait(run, refusal, policy, None) == plan


@settings(max_examples=200, deadline=None)
@given(since=st.one_of(st.none(), st.integers(1, NOW)), attempts=st.integers(0, 20),
       hint=st.floats(0, 100), max_wait=st.one_of(st.none(), st.floats(0.1, 100)),
       ceiling=st.one_of(st.none(), st.floats(0.1, 100)))
def test_a_run_sent_back_comes_back_before_its_max_wait_and_ceiling(
        since, attempts, hint, max_wait, ceiling):
    policy = RetryPolicy(backoff=1.0, backoff_max=30.0, max_wait=max_wait)
    run = WaitingRun(since=since, attempts=attempts, carried=True)
    plan = plan_wait(run, at_now(retry_hint=hint), policy, ceiling)
    waited = (NOW - since) / 1000 if since else 0.0
    if isinstance(plan, GiveUp):
        assert max_wait is not None and waited >= max_wait and plan.waited == waited
        return
    assert plan.since == (since or NOW)
    assert 0 <= plan.countdown <= (ceiling if ceiling is not None else 30.0)
    if max_wait is not None:
        assert waited < max_wait and plan.countdown <= max_wait - waited + 1e-9
