"""The parked line's scripts on a real redis-server, driven by a hypothesis state machine
over a simulated broker (a task queue, a FIFO parking queue per semaphore) and workers:
sends, deliveries (asks), a redelivered original beside its parked copy (a worker died
between publishing the copy and acknowledging the original), bodies that start and end,
workers that die before a body starts (their worker frees the slot, or the lease runs
out unreleased and the claim lapses; the message comes back), releases that never reach
the store (the lease runs out) and arrive late,
moves out of parking (first in first out; some cut between their publish and their
acknowledgement, which leaves two copies), moves that find nothing, polls. Runs have a
global cap and one of two tenants' keys, or a tenant's key alone.

After every step: no semaphore holds more than its slots, and no run has two bodies. At
the end, with every owed move made, polls, and every body ended: every run sent ran
exactly once, every parking queue is empty, no line counts a waiter, and once every
lease has run out no claim is left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from celery_redislock.engine.admission import (
    Busy,
    Lease,
    ParkedMove,
    ParkRef,
    Served,
    SlotLimit,
    declare_fresh,
)
from celery_redislock.engine.parking import due, moved_nothing, park_admit, run_id, started

PREFIX = "states:"
LIMITS = {"all": 2, "a": 1, "b": 1}


@dataclass
class Message:
    task: str
    keys: List[str]            # the names of its limits
    park: Optional[ParkRef] = None
    acks_late: bool = False    # its claim is served as its body ends, not as it starts


@dataclass
class Body:
    task: str
    lease: Lease
    message: Message
    started: bool = False


@dataclass
class Broker:
    queue: List[Message] = field(default_factory=list)
    parking: Dict[str, List[Message]] = field(default_factory=dict)


def limiter(name: str) -> SlotLimit:
    return SlotLimit(name, LIMITS[name], PREFIX)


class ParkedLine(RuleBasedStateMachine):
    client: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.client.flushdb()
        declare_fresh(self.client, PREFIX)
        self.broker = Broker()
        self.bodies: List[Body] = []
        self.moves: List[str] = []
        self.sent: List[str] = []
        self.ran: Dict[str, int] = {}
        self.ended: Set[str] = set()
        self.late_releases: List[Lease] = []
        self.may_repeat: Set[str] = set()  # acks_late runs whose release was lost

    # --- the app and the workers ----------------------------------------------------

    @rule(tenant=st.sampled_from(["a", "b"]), capped=st.booleans(), acks_late=st.booleans())
    def send(self, tenant: str, capped: bool, acks_late: bool) -> None:
        task = f"t{len(self.sent)}"
        self.sent.append(task)
        keys = ["all", tenant] if capped else [tenant]
        self.broker.queue.append(Message(task, keys, acks_late=acks_late))

    @precondition(lambda self: self.broker.queue)
    @rule(window=st.booleans())
    def deliver(self, window: bool) -> None:
        """The head of the task queue is asked for; refused, its copy is parked (with
        ``window``, the original comes back too: a worker died before acknowledging it)."""
        message = self.broker.queue.pop(0)
        outcome = park_admit(self.client, [limiter(name) for name in message.keys],
                             lease=60, run=run_id(message.task, 0), parked=message.park)
        self.owe(outcome.handoffs)
        if isinstance(outcome, Lease):
            self.bodies.append(Body(message.task, outcome, message))
        elif isinstance(outcome, Busy):
            assert outcome.park is not None
            copy = Message(message.task, message.keys, outcome.park, message.acks_late)
            self.broker.parking.setdefault(outcome.park.key, []).append(copy)
            if window:
                self.broker.queue.append(message)
        else:  # a stale copy (a newer one waits, or the run was served): it ends
            assert isinstance(outcome, Served), outcome

    @precondition(lambda self: self.bodies)
    @rule(data=st.data())
    def start(self, data: Any) -> None:
        body = data.draw(st.sampled_from(self.bodies))
        if not body.started:
            body.started = True
            if not body.message.acks_late:
                started(body.lease)
            self.ran[body.task] = self.ran.get(body.task, 0) + 1
            assert self.ran[body.task] == 1 or body.task in self.may_repeat, \
                f"{body.task} ran twice"

    @precondition(lambda self: any(body.started for body in self.bodies))
    @rule(data=st.data(), lost=st.booleans())
    def end(self, data: Any, lost: bool = False) -> None:
        """A body ends and releases. With ``lost`` its release never reaches the store
        (it did not answer): its lease runs out; the release arrives later, or never.
        Under ``acks_late`` its claim is left (its start served nothing): it lapses, and
        a copy of the run the broker still holds claims in the dead holder's place and
        runs again (as Celery runs an ``acks_late`` run again whose end it did not see)."""
        body = data.draw(st.sampled_from([body for body in self.bodies if body.started]))
        self.bodies.remove(body)
        self.ended.add(body.task)
        if not lost:
            assert body.lease.release()
            self.owe(body.lease.handoffs)
            return
        if body.message.acks_late:
            self.may_repeat.add(body.task)
        for key in body.lease._keys:
            run_out(self.client, key, body.lease)
        self.poll()  # the next poll: a claim of the lease lapsed
        for key in body.lease._keys:
            claims = key.replace("}:s:", "}:pc:", 1)
            assert self.client.hget(claims, body.lease.token) is None, "a claim did not lapse"
        self.late_releases.append(body.lease)

    @precondition(lambda self: any(not body.started for body in self.bodies))
    @rule(data=st.data(), ran_out=st.booleans())
    def crash(self, data: Any, ran_out: bool) -> None:
        """A worker dies before the body started: its holder is gone from the
        semaphores (its worker's main process freed it), or with ``ran_out`` its lease
        runs out unreleased; the broker gives its message back."""
        body = data.draw(st.sampled_from([body for body in self.bodies if not body.started]))
        self.bodies.remove(body)
        for key in body.lease._keys:
            if ran_out:
                run_out(self.client, key, body.lease)
            else:
                self.client.zrem(key, body.lease._member)
        self.broker.queue.append(body.message)

    @precondition(lambda self: self.late_releases)
    @rule()
    def late_release(self) -> None:
        """A release that did not reach the store arrives after its lease ran out: it
        frees no slot that another holder has (the invariants)."""
        lease = self.late_releases.pop(0)
        lease.release()
        self.owe(lease.handoffs)

    @precondition(lambda self: self.moves)
    @rule(window=st.booleans())
    def move(self, window: bool = False) -> None:
        """One move owed (first in first out; with ``window``, a broker without an
        atomic move whose mover died between the publish and the acknowledgement: the
        message is in both queues)."""
        key = self.moves.pop(0)
        parked = self.broker.parking.get(key)
        if parked:
            self.broker.queue.insert(0, parked[0] if window else parked.pop(0))
        else:
            moved_nothing(self.client, key)

    @rule()
    def poll(self) -> None:
        lengths = {limiter(name).key: len(self.broker.parking.get(limiter(name).key, []))
                   for name in LIMITS}
        self.owe(due(self.client, lengths, prefix=PREFIX))

    def owe(self, handoffs: List[Any]) -> None:
        assert all(isinstance(entry, ParkedMove) for entry in handoffs), handoffs
        self.moves.extend(entry.key for entry in handoffs)

    # --- what must hold -------------------------------------------------------------

    @invariant()
    def within_limits(self) -> None:
        for name, slots in LIMITS.items():
            holding = sum(name in body_keys(body) for body in self.bodies)
            assert holding <= slots, f"{holding} bodies hold {name} ({slots} slots)"
            live = f"({server_ms(self.client)}"  # a lease that ran out holds nothing
            assert self.client.zcount(limiter(name).key, live, "+inf") <= slots

    @invariant()
    def counts_match_references(self) -> None:
        """Each line's count of waiting references is the number of its references
        that wait (a scan, here only)."""
        for name in LIMITS:
            key = limiter(name).key
            refs = self.client.hvals(key.replace("}:s:", "}:pr:", 1))
            waiting = sum(ref.startswith(b"w ") for ref in refs)
            count = int(self.client.hget(key.replace("}:s:", "}:pn:", 1), "w") or 0)
            assert count == waiting, f"{name}: count {count}, {waiting} waiting"

    def teardown(self) -> None:
        for _ in range(1000):
            if self.bodies:
                body = self.bodies[0]
                if not body.started:
                    self.start(_Always(body))
                self.end(_Always(body))
            elif self.broker.queue:
                self.deliver(window=False)
            elif self.moves:
                self.move()
            else:
                self.poll()
                if not (self.moves or self.broker.queue):
                    break
        assert not self.bodies and not self.broker.queue
        assert all(not parked for parked in self.broker.parking.values()), self.broker.parking
        assert sorted(self.ran) == sorted(self.sent), (self.ran, self.sent)
        for name in LIMITS:
            names = limiter(name).key.replace("}:s:", "}:pn:", 1)
            assert int(self.client.hget(names, "w") or 0) == 0
        # The clock runs on: every lease left (holders freed by their worker, whose
        # claims end with the lease) runs out, and the poll lapses their claims.
        for name in LIMITS:
            ends = limiter(name).key.replace("}:s:", "}:pe:", 1)
            for member in self.client.zrange(ends, 0, -1):
                if b" " not in member:
                    self.client.zadd(ends, {member: 1}, xx=True)
        self.poll()
        for name in LIMITS:
            claims = limiter(name).key.replace("}:s:", "}:pc:", 1)
            assert self.client.hlen(claims) == 0, self.client.hgetall(claims)


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def run_out(client: Any, key: str, lease: Lease) -> None:
    """The server's clock passes the end of ``lease`` at ``key``: its end, in the
    semaphore and in the ends of its claims, is put in the past."""
    client.zadd(key, {lease._member: 1}, xx=True)
    client.zadd(key.replace("}:s:", "}:pe:", 1), {lease.token: 1}, xx=True)


def body_keys(body: Body) -> List[str]:
    return [key.split("}:s:", 1)[1] for key in body.lease._keys]


class _Always:
    """A stand-in for hypothesis's ``data`` that draws the given body."""

    def __init__(self, body: Body) -> None:
        self.body = body

    def draw(self, _: Any) -> Body:
        return self.body


STATES = settings(max_examples=int(os.environ.get("PARKING_STATES_EXAMPLES", "60")),
                  stateful_step_count=40, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.usefixtures("redis_client")
def test_the_parked_line_serves_every_run_once_within_its_limits(redis_client):
    ParkedLine.client = redis_client
    ParkedLine.TestCase.settings = STATES
    ParkedLine.TestCase("runTest").runTest()
