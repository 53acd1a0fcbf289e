"""Design (c), "the broker is the line", as an executable specification.

A hypothesis state machine drives the pure model of :mod:`waiting_model` (no Redis, no
Celery) through random interleavings of sends, deliveries, every step of every worker
(asks, parking moves, bodies, releases, moves out of parking), worker crashes at any of
those steps, redeliveries, lock store restarts with and without data, the store not
answering, and the clock. After every step:

* never more bodies running than slots per key, a crashed body counted as running until
  its lease could end;
* at most one body per attempt (:func:`waiting_model.worker.check_one_body`), but where
  Celery itself would run it again (``acks_late`` and killed before its
  acknowledgement), or where two copies of it met a loss of the store's data (the
  design states this one);

and at the end (teardown), once faults stop and the clock runs (:func:`drain`): no run
lost (every run sent ran its body, or was lost by Celery's own default acks with its
worker), no message left in any queue, and the lines of the store empty.

The model follows the fixed protocol (:class:`waiting_model.worker.Protocol`'s
defaults); ``test_as_written_*`` replay the counter-examples the model found in the
protocol as first written (``docs/architecture.md``, "What the model test found").
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import Any, Callable, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from waiting_model import store as scripts
from waiting_model import worker as protocol
from waiting_model.broker import main_queue
from waiting_model.worker import AS_WRITTEN, Protocol, Worker, World

#: Two keys: one slot and two slots.
SLOTS = {"a": 1, "b": 2}
WORKERS = 2
KEYS = st.sampled_from(sorted(SLOTS))
WORKER = st.integers(0, WORKERS - 1)


def new_world(design: Protocol) -> World:
    world = World(design, dict(SLOTS))
    world.workers = [world.new_worker() for _ in range(WORKERS)]
    return world


def busy(world: World) -> bool:
    """Anything left to do: a message anywhere, a job, a move owed, a dead worker's
    deliveries not yet given back, an entry in a line (an anonymous one counted too
    many clears when a move finds its parking queue empty)."""
    broker, store = world.broker, world.store
    return bool(any(broker.queues.values()) or broker.unacked or world.dead
                or any(w.jobs or w.moves for w in world.workers)
                or any(store.lines().values()) or any(store.anonymous.values()))


def settle_round(world: World) -> bool:
    """Every worker does all it can without time passing; whether anything happened."""
    moved = bool(world.dead)
    protocol.redeliver(world)
    for worker in world.workers:
        for key in sorted(world.slots):
            while protocol.deliver(world, worker, key):
                moved = True
        while worker.jobs or worker.moves:
            moved = True
            for job in list(worker.jobs):
                protocol.step(world, worker, job)
            if worker.moves:
                protocol.move_step(world, worker)
        protocol.due_poll(world, worker)
        moved = moved or bool(worker.moves)
    return moved


def drain(world: World, rounds: int = 300) -> None:
    """Faults stop and the clock runs: then no run is lost and nothing is left over."""
    world.store.up = True
    for _ in range(rounds):
        if settle_round(world):
            continue
        if not busy(world):
            break
        protocol.tick(world, 5)
    lost = sorted(set(world.sent) - world.done - world.celery_lost)
    assert not lost, f"runs lost: {lost}; parked: {dict(world.broker.queues)}"
    assert not busy(world), f"left over: {world.broker.queues}, {world.broker.unacked}"
    store = world.store
    assert not any(store.lines().values()) and not any(store.anonymous.values()), (
        f"the store's lines are not empty: {store.lines()}, {store.anonymous}")


def guarded(function: Callable[..., None]) -> Callable[..., None]:
    """Mark the machine failed when a step raises (teardown then skips the drain)."""
    @functools.wraps(function)
    def step(self: WaitingModel, **kwargs: Any) -> None:
        self.failed = True
        function(self, **kwargs)
        self.failed = False
    return step


class WaitingModel(RuleBasedStateMachine):
    """Random interleavings over :mod:`waiting_model`; see the module's docstring."""

    design = Protocol()

    def __init__(self) -> None:
        super().__init__()
        self.failed = False
        self.crashes = 0          # budgets: each kind of fault its own
        self.store_faults = 0
        self.world = new_world(self.design)

    @initialize(lmove=st.booleans())
    def broker_kind(self, lmove: bool) -> None:
        """Redis (a move out of parking is one LMOVE) or another broker (get, publish, ack)."""
        self.world = new_world(replace(self.design, lmove=lmove))

    @precondition(lambda self: len(self.world.sent) < 8)
    @rule(key=KEYS, acks_late=st.booleans())
    @guarded
    def send(self, key: str, acks_late: bool) -> None:
        protocol.send(self.world, key, acks_late)

    # Each rule applies only where it does something, and falls back from the worker
    # drawn to the next one it applies to: no step of the budget is spent on a no-op.

    def busy_worker(self, worker: int, has: Callable[[Worker], Any]) -> Worker:
        """Worker ``worker``, or the next one that ``has`` something."""
        workers = self.world.workers
        order = [workers[(worker + shift) % WORKERS] for shift in range(WORKERS)]
        return next((each for each in order if has(each)), workers[worker])

    def has(self, what: Callable[[Worker], Any]) -> bool:
        return any(what(worker) for worker in self.world.workers)

    @precondition(lambda self: any(self.world.broker.queues.get(main_queue(key))
                                   for key in SLOTS))
    @rule(worker=WORKER, key=KEYS)
    @guarded
    def deliver(self, worker: int, key: str) -> None:
        if not self.world.broker.length(main_queue(key)):
            key = next(k for k in sorted(SLOTS) if self.world.broker.length(main_queue(k)))
        protocol.deliver(self.world, self.world.workers[worker], key)

    @precondition(lambda self: self.has(lambda worker: worker.jobs))
    @rule(worker=WORKER, job=st.integers(0, 7))
    @guarded
    def advance(self, worker: int, job: int) -> None:
        """The next step of one delivery: ask, park, publish, ack, start, end, release..."""
        chosen = self.busy_worker(worker, lambda each: each.jobs)
        protocol.step(self.world, chosen, chosen.jobs[job % len(chosen.jobs)])

    @precondition(lambda self: self.has(lambda worker: worker.moves))
    @rule(worker=WORKER)
    @guarded
    def move(self, worker: int) -> None:
        """The next step of a worker's oldest move out of parking."""
        protocol.move_step(self.world, self.busy_worker(worker, lambda each: each.moves))

    @precondition(lambda self: self.world.protocol.due_poll and self.world.store.up)
    @rule(worker=WORKER)
    @guarded
    def poll(self, worker: int) -> None:
        protocol.due_poll(self.world, self.world.workers[worker])

    @precondition(lambda self: self.crashes < 3
                  and self.has(lambda worker: worker.jobs or worker.moves))
    @rule(worker=WORKER)
    @guarded
    def crash(self, worker: int) -> None:
        """A worker with something in hand dies, between any two of its steps."""
        self.crashes += 1
        chosen = self.busy_worker(worker, lambda each: each.jobs or each.moves)
        protocol.crash(self.world, self.world.workers.index(chosen))

    @precondition(lambda self: self.world.dead)
    @rule()
    @guarded
    def redeliver(self) -> None:
        protocol.redeliver(self.world)

    @precondition(lambda self: self.store_faults < 2)
    @rule(keep_data=st.booleans())
    @guarded
    def restart_store(self, keep_data: bool) -> None:
        self.store_faults += 1
        scripts.restart(self.world.store, keep_data, self.world.now)
        self.world.data_lost |= not keep_data

    @precondition(lambda self: self.store_faults < 2 or not self.world.store.up)
    @rule()
    @guarded
    def store_unreachable(self) -> None:
        """The store stops answering, or answers again (no time passes meanwhile)."""
        self.store_faults += self.world.store.up
        self.world.store.up = not self.world.store.up

    @precondition(lambda self: self.world.store.up)
    @rule(seconds=st.sampled_from([1, 5, 10]))
    @guarded
    def tick(self, seconds: int) -> None:
        protocol.tick(self.world, seconds)

    @invariant()
    def within_limits(self) -> None:
        try:
            protocol.check_limits(self.world)
        except AssertionError:
            self.failed = True
            raise

    def teardown(self) -> None:
        if not self.failed:
            drain(self.world)


#: Sized for the default suite (a few seconds); ``WAITING_MODEL_EXAMPLES=5000`` searches
#: deeper (a counter-example of six chosen steps among ~200 interleavings per step, such
#: as :data:`SENT_BACK_TWICE`, may take a few thousand).
FAST = settings(max_examples=int(os.environ.get("WAITING_MODEL_EXAMPLES", "500")),
                stateful_step_count=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def test_design_c() -> None:
    """Design (c) with the model's fixes: within limits, one body per attempt, none lost."""
    run_state_machine_as_test(WaitingModel, settings=FAST)


# --- the counter-examples the model found in the protocol as first written -------------

Step = Tuple[str, Dict[str, Any]]


def replay(design: Protocol, steps: List[Step]) -> WaitingModel:
    """Run ``steps`` (as hypothesis prints them) on a machine following ``design``,
    then its teardown (the drain and its checks)."""
    machine = WaitingModel()
    machine.world = new_world(design)
    for name, arguments in steps:
        getattr(machine, name)(**arguments)
        machine.within_limits()
    machine.teardown()
    return machine


#: A run is admitted, its worker dies; the redelivered run parks behind the dead
#: holder's slot, whose lease runs out: no release ever comes.
LEASE_RUNS_OUT: List[Step] = [
    ("send", {"key": "a", "acks_late": False}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("advance", {"worker": 0, "job": 0}),
    ("crash", {"worker": 0}),
]

#: The store restarts without its data: the run is refused in the grace and parks;
#: the grace ends, and no release comes.
PARKED_IN_THE_GRACE: List[Step] = [
    ("send", {"key": "a", "acks_late": False}),
    ("restart_store", {"keep_data": False}),
]

#: t1 is refused while t0 holds the slot; t0 ends and releases before t1's reference
#: is written (``park.lua`` after the refusal): the release finds nobody waiting.
MISSED_WAKE_UP: List[Step] = [
    ("send", {"key": "a", "acks_late": False}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("send", {"key": "a", "acks_late": False}),
    ("advance", {"worker": 0, "job": 0}),     # t0 admitted; the drain does the rest
]

#: The store does not answer: the run is sent back (a copy published), and its worker
#: dies before acknowledging the original: two copies, nothing to tell them apart.
SENT_BACK_TWICE: List[Step] = [
    ("store_unreachable", {}),
    ("send", {"key": "b", "acks_late": False}),
    ("deliver", {"worker": 0, "key": "b"}),
    ("advance", {"worker": 0, "job": 0}),     # the ask: no answer, send back
    ("advance", {"worker": 0, "job": 0}),     # the copy published
    ("crash", {"worker": 0}),
]


#: The same with the reference written by the refusal: t1 is admitted on worker 0 while
#: t0 is refused on worker 1 (its reference written); t1 ends, and the move its release
#: asks for finds the parking queue still empty: worker 1 has not published t0 yet.
MISSED_WAKE_UP_REFERENCE_FIRST: List[Step] = [
    ("send", {"key": "a", "acks_late": False}),
    ("deliver", {"worker": 1, "key": "a"}),
    ("send", {"key": "a", "acks_late": False}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("advance", {"worker": 0, "job": 0}),     # t1 admitted
    ("advance", {"worker": 1, "job": 0}),     # t0 refused, its reference written
]


#: t1 parks behind t0; t0's release moves t1's copy out of parking; the copy claims
#: the slot, and its worker dies before the body starts. The copy comes back: its
#: reference, removed by the claim, no longer names it, and it ends as stale.
CLAIMED_THEN_DIED: List[Step] = [
    ("send", {"key": "a", "acks_late": False}),
    ("send", {"key": "a", "acks_late": False}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("advance", {"worker": 0, "job": 0}),     # t0 admitted
    ("advance", {"worker": 0, "job": 1}),     # t1 refused, its reference written
    ("advance", {"worker": 0, "job": 1}),     # t1's parked copy published
    ("advance", {"worker": 0, "job": 1}),     # t1's original acknowledged
    ("advance", {"worker": 0, "job": 0}),     # t0's body starts
    ("advance", {"worker": 0, "job": 0}),     # t0's body ends: a move owed
    ("move", {"worker": 0}),                  # LMOVE: t1's copy to the task's queue
    ("deliver", {"worker": 1, "key": "a"}),
    ("advance", {"worker": 1, "job": 0}),     # t1's copy claims the reservation
    ("crash", {"worker": 1}),
]

#: t1's worker dies between publishing its parked copy and acknowledging the original;
#: the copy is claimed and runs; the original comes back later (a Redis broker gives
#: it back after its visibility timeout), finds no reference and runs as a newcomer.
ORIGINAL_AFTER_ITS_COPY_RAN: List[Step] = [
    ("send", {"key": "a", "acks_late": False}),
    ("send", {"key": "a", "acks_late": False}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("deliver", {"worker": 1, "key": "a"}),
    ("advance", {"worker": 0, "job": 0}),     # t0 admitted
    ("advance", {"worker": 1, "job": 0}),     # t1 refused, its reference written
    ("advance", {"worker": 1, "job": 0}),     # t1's parked copy published
    ("crash", {"worker": 1}),                 # before the original's acknowledgement
    ("advance", {"worker": 0, "job": 0}),     # t0's body starts
    ("advance", {"worker": 0, "job": 0}),     # t0's body ends: a move owed
    ("move", {"worker": 0}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("advance", {"worker": 0, "job": 0}),     # t1's copy claims
    ("advance", {"worker": 0, "job": 0}),     # t1's body starts
    ("advance", {"worker": 0, "job": 0}),     # and ends
    ("redeliver", {}),                        # the original comes back
]


#: t1 (acks late) parks behind t0 and its copy is moved out of parking and runs on
#: worker 1; its release serves its reference, and worker 1 dies before the
#: acknowledgement (and the result). The copy comes back: a served mark that ends every
#: copy ends it unrun, and the run is lost where Celery runs it again.
SERVED_THEN_KILLED: List[Step] = [
    ("send", {"key": "a", "acks_late": True}),
    ("send", {"key": "a", "acks_late": True}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("deliver", {"worker": 0, "key": "a"}),
    ("advance", {"worker": 0, "job": 0}),     # t0 admitted
    ("advance", {"worker": 0, "job": 1}),     # t1 refused, its reference written
    ("advance", {"worker": 0, "job": 1}),     # t1's parked copy published
    ("advance", {"worker": 0, "job": 1}),     # t1's original acknowledged
    ("advance", {"worker": 0, "job": 0}),     # t0's body starts
    ("advance", {"worker": 0, "job": 0}),     # t0's body ends: a move owed
    ("advance", {"worker": 0, "job": 0}),     # t0 acknowledged
    ("move", {"worker": 0}),                  # LMOVE: t1's copy to the task's queue
    ("deliver", {"worker": 1, "key": "a"}),
    ("advance", {"worker": 1, "job": 0}),     # t1's copy claims the reservation
    ("advance", {"worker": 1, "job": 0}),     # t1's body starts
    ("advance", {"worker": 1, "job": 0}),     # and ends: its release serves it
    ("crash", {"worker": 1}),                 # before the acknowledgement
]


@pytest.mark.parametrize("steps, design, found", [
    (LEASE_RUNS_OUT, replace(AS_WRITTEN, lmove=False), "runs lost"),
    (PARKED_IN_THE_GRACE, AS_WRITTEN, "runs lost"),
    (MISSED_WAKE_UP, AS_WRITTEN, "runs lost"),
    (MISSED_WAKE_UP_REFERENCE_FIRST, Protocol(due_poll=False), "runs lost"),
    (SENT_BACK_TWICE, AS_WRITTEN, "a second body"),
    (CLAIMED_THEN_DIED, AS_WRITTEN, "runs lost"),
    (CLAIMED_THEN_DIED, Protocol(keep_claims=False), "runs lost"),
    (ORIGINAL_AFTER_ITS_COPY_RAN, Protocol(keep_claims=False), "a second body"),
    (SERVED_THEN_KILLED, Protocol(copy_ids=False), "runs lost"),
], ids=["lease-runs-out", "parked-in-the-grace", "missed-wake-up",
        "missed-wake-up-reference-first", "sent-back-twice", "claimed-then-died",
        "claimed-then-died-with-the-other-fixes", "original-after-its-copy-ran",
        "served-then-killed"])
def test_as_written_fails(steps: List[Step], design: Protocol, found: str) -> None:
    """Each counter-example fails the protocol as first written, and passes the fixed one."""
    with pytest.raises(AssertionError, match=found):
        replay(design, steps)
    replay(Protocol(), steps)


def test_the_stated_exception_is_reached() -> None:
    """A move out of parking cut between its publish and its acknowledgement (two copies),
    then a loss of the store's data: each copy is admitted as a newcomer, and the body
    runs twice. The design states this; the model reaches it."""
    steps: List[Step] = [
        ("broker_kind", {"lmove": False}),
        ("send", {"key": "a", "acks_late": False}),
        ("send", {"key": "a", "acks_late": False}),
        ("deliver", {"worker": 0, "key": "a"}),
        ("deliver", {"worker": 0, "key": "a"}),
        ("advance", {"worker": 0, "job": 0}),   # t0 admitted
        ("advance", {"worker": 0, "job": 1}),   # t1 refused, its reference written
        ("advance", {"worker": 0, "job": 1}),   # parked copy published
        ("advance", {"worker": 0, "job": 1}),   # original acknowledged
        ("advance", {"worker": 0, "job": 0}),   # t0's body starts
        ("advance", {"worker": 0, "job": 0}),   # t0's body ends: a move owed
        ("move", {"worker": 0}),                # the mover gets t1's parked copy
        ("move", {"worker": 0}),                # and publishes it to the task's queue
        ("crash", {"worker": 0}),               # before acknowledging it
        ("restart_store", {"keep_data": False}),
        ("tick", {"seconds": 10}), ("tick", {"seconds": 10}), ("tick", {"seconds": 10}),
    ]
    machine = replay(Protocol(), steps)
    assert len(machine.world.bodies[("t1", 0)]) == 2
