"""Workers following design (c)'s protocol, one small function per step.

Each step is what one interpreter does between two points where a worker can die: a
call to the lock store (one script), a publish, an acknowledgement, a body's start or
end. A :class:`Job` is one delivery in a worker; its ``phase`` names the next step:

========== ======================== ==============================================
phase      step                     the real implementation
========== ======================== ==============================================
received   :func:`ask`              the gate's admission (``admit``/``claim``), then
                                    :func:`~celery_redislock.run.decide.decide`
park_ref   :func:`write_reference`  ``park.lua`` (as first written: after the refusal)
publish    :func:`publish_parked`   the mover publishes the parked copy
ack        :func:`ack_original`     the loop acknowledges the original (the move ends)
send_back  :func:`send_back`        the store did not answer
end        :func:`end_stale`        a stale copy ends without running
ready      :func:`start_body`       the pool starts the body (default acks: ack first)
running    :func:`end_body`         the body ends: release, hand over, owe moves
ack_late   :func:`ack_late`         ``acks_late``: acknowledge after the body
========== ======================== ==============================================

A worker's mover moves one message out of a parking queue per reservation it was
handed (:func:`move_step`); its due poll (:func:`due_poll`) is the fixed protocol's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

from celery_redislock.engine.admission import Busy
from celery_redislock.run.decide import End, Run, SendBack, decide

from . import store as scripts
from .broker import Broker, Delivery, Message, main_queue, parking_queue

RunId = Tuple[str, int]


@dataclass(frozen=True)
class Protocol:
    """Design (c) as written (all False) or with the model's fixes (the defaults).

    * ``ref_on_refusal``: the refusing admission writes the reference in the same
      script (as written: ``park.lua`` after the refusal, a lost wake-up between them);
    * ``due_poll``: each worker's poll hands over slots freed without a release (a lease
      run out, a reservation lapsed, the grace ended) and counts a parking queue the line
      knows nothing of (a park across a loss of the store);
    * ``requeue_when_down``: a store that does not answer sends the run back with
      ``reject(requeue=True)``, one step in the broker (as written: publish, then ack,
      a two-copy window nothing deduplicates);
    * ``keep_claims``: a claim keeps the reference, claimed by its holder, until the body
      starts (default acks) or ends (``acks_late``), then served for as long as the
      broker may give back a copy (as written: the claim removes it);
    * ``lmove``: the broker is Redis (a move out of parking is one ``LMOVE``); else a
      move is get, publish, acknowledge;
    * ``copy_ids``: each moved copy carries an id of its own (written when parked on
      Redis, when moved elsewhere), and under ``acks_late`` its claim and served mark
      keep it: that copy, given back after its worker died past the release, runs again
      (as written: a served mark ends every copy, and that run was lost).
    """

    ref_on_refusal: bool = True
    due_poll: bool = True
    requeue_when_down: bool = True
    keep_claims: bool = True
    lmove: bool = True
    copy_ids: bool = True


AS_WRITTEN = Protocol(ref_on_refusal=False, due_poll=False, requeue_when_down=False,
                      keep_claims=False)


@dataclass
class Body:
    run: RunId
    key: str
    life: int
    start: int
    renewed: int
    end: Optional[int] = None
    killed: Optional[int] = None

    def running(self, now: int) -> bool:
        """Counted as running: live, or killed but its lease could not have ended yet."""
        if self.end is not None:
            return False
        return self.killed is None or self.renewed + scripts.LEASE > now


@dataclass
class Job:
    delivery: Delivery
    phase: str = "received"
    park_id: str = ""
    holder: str = ""
    renewed: int = 0        # when its lease was taken or last extended
    body: Optional[Body] = None

    @property
    def message(self) -> Message:
        return self.delivery.message


@dataclass
class Move:
    key: str
    phase: str = "get"
    delivery: Optional[Delivery] = None


@dataclass
class Worker:
    life: int
    jobs: List[Job] = field(default_factory=list)
    moves: List[Move] = field(default_factory=list)


@dataclass
class World:
    protocol: Protocol
    slots: Dict[str, int]
    broker: Broker = field(default_factory=Broker)
    store: scripts.Store = field(init=False)
    now: int = 0
    workers: List[Worker] = field(default_factory=list)
    lives: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    dead: List[int] = field(default_factory=list)
    sent: Dict[RunId, Message] = field(default_factory=dict)
    bodies: Dict[RunId, List[Body]] = field(default_factory=dict)
    done: Set[RunId] = field(default_factory=set)
    celery_lost: Set[RunId] = field(default_factory=set)     # default acks, body killed
    celery_reruns: Set[RunId] = field(default_factory=set)   # acks_late, killed unacked
    had_two_copies: Set[RunId] = field(default_factory=set)
    data_lost: bool = False

    def __post_init__(self) -> None:
        self.store = scripts.Store(dict(self.slots), self.protocol.keep_claims)

    def new_worker(self) -> Worker:
        return Worker(next(self.lives))

    def count_copies(self, run: RunId) -> None:
        if self.broker.copies(run) > 1:
            self.had_two_copies.add(run)


# --- the app ---------------------------------------------------------------------------

def send(world: World, key: str, acks_late: bool) -> RunId:
    """``task.delay()``: one message on the task's queue."""
    message = Message(next(world.broker.ids), f"t{len(world.sent)}", key, acks_late)
    world.sent[message.run] = message
    world.broker.publish(main_queue(key), message)
    return message.run


def deliver(world: World, worker: Worker, key: str) -> bool:
    """The consumer receives the head of the task's queue (unacknowledged)."""
    delivery = world.broker.get(main_queue(key), worker.life)
    if delivery is not None:
        worker.jobs.append(Job(delivery))
    return delivery is not None


# --- one delivery's steps --------------------------------------------------------------

def ask(world: World, worker: Worker, job: Job) -> None:
    """The gate asks the store (``claim`` for a parked copy, else ``admit``) and
    :func:`decide` chooses: run, park (SendBack of a refusal), send back, end."""
    outcome, park_id = _answer(world, worker, job)
    action = decide(outcome)
    if isinstance(action, Run):
        job.phase = "ready"
    elif isinstance(action, End):
        job.phase = "end"
    elif isinstance(action, SendBack) and isinstance(action.refusal, Busy):
        job.park_id = park_id
        job.phase = "publish" if park_id else "park_ref"
    else:
        job.phase = "send_back"


def _answer(world: World, worker: Worker, job: Job) -> Tuple[object, str]:
    store, message, now = world.store, job.message, world.now
    if not store.up:
        return None, ""
    if store.counted != store.incarnation:
        scripts.recount(store, _parked(world))
    job.holder = f"{worker.life}:{job.delivery.tag}"
    job.renewed = now
    fixed = world.protocol.ref_on_refusal
    park_id = message.wait.park_id
    copy = message.wait.move if message.acks_late and world.protocol.copy_ids else ""
    if park_id:
        return scripts.claim(store, message.key, message.run, park_id, job.holder, now, fixed,
                             copy)
    return scripts.admit(store, message.key, message.run, job.holder, now, fixed)


def write_reference(world: World, worker: Worker, job: Job) -> None:
    """As first written: ``park.lua`` after the refusal, before the publish."""
    if not world.store.up:
        job.phase = "send_back"
        return
    job.park_id = scripts.park(world.store, job.message.key, job.message.run, world.now)
    job.phase = "publish"


def publish_parked(world: World, worker: Worker, job: Job) -> None:
    """The mover publishes the parked copy (its park id in its wait; on Redis, where it
    moves once, its copy id too): the move's first half."""
    message = job.message
    wait = message.wait
    wait = wait.but(park_id=job.park_id, line=message.key, attempts=wait.attempts + 1,
                    since=wait.since or world.now * 1000 or 1,
                    move=f"m{next(world.broker.ids)}" if world.protocol.lmove else "")
    world.broker.publish(parking_queue(message.key), world.broker.copy(message, wait))
    world.count_copies(message.run)
    job.phase = "ack"


def ack_original(world: World, worker: Worker, job: Job) -> None:
    """The loop acknowledges the original: the move's second half; the job is over."""
    world.broker.ack(job.delivery.tag)
    worker.jobs.remove(job)


def send_back(world: World, worker: Worker, job: Job) -> None:
    """The store did not answer: fixed, ``reject(requeue=True)`` (one step); as written,
    a copy published with a countdown, then the original acknowledged."""
    if world.protocol.requeue_when_down:
        world.broker.requeue(job.delivery.tag)
        worker.jobs.remove(job)
        return
    message = job.message
    world.broker.publish(main_queue(message.key), world.broker.copy(message, message.wait))
    world.count_copies(message.run)
    job.phase = "ack"


def end_stale(world: World, worker: Worker, job: Job) -> None:
    """A stale copy (its reference names another, or none): acknowledged, no body."""
    world.broker.ack(job.delivery.tag)
    worker.jobs.remove(job)


def start_body(world: World, worker: Worker, job: Job) -> None:
    """The pool starts the body; under default acks the message is acknowledged first."""
    message = job.message
    if not message.acks_late:
        world.broker.ack(job.delivery.tag)
        if world.store.up:
            scripts.started(world.store, message.key, job.holder)
    check_one_body(world, message.run)
    job.body = Body(message.run, message.key, worker.life, world.now, job.renewed)
    world.bodies.setdefault(message.run, []).append(job.body)
    job.phase = "running"


def end_body(world: World, worker: Worker, job: Job) -> None:
    """The body ends: the release hands its slot over and the worker owes that many moves
    (``acks_late``: the result is stored with the acknowledgement, after the release)."""
    assert job.body is not None
    job.body.end = world.now
    if not job.message.acks_late:
        world.done.add(job.message.run)
    if world.store.up:
        moves = scripts.release(world.store, job.message.key, job.holder, world.now)
        worker.moves += [Move(job.message.key) for _ in range(moves)]
    if job.message.acks_late:
        job.phase = "ack_late"
    else:
        worker.jobs.remove(job)


def ack_late(world: World, worker: Worker, job: Job) -> None:
    world.done.add(job.message.run)
    world.broker.ack(job.delivery.tag)
    worker.jobs.remove(job)


STEPS: Dict[str, Callable[[World, Worker, Job], None]] = {
    "received": ask, "park_ref": write_reference, "publish": publish_parked,
    "ack": ack_original, "send_back": send_back, "end": end_stale, "ready": start_body,
    "running": end_body, "ack_late": ack_late,
}


def step(world: World, worker: Worker, job: Job) -> None:
    """The job's next step (a store step waits while the store is down: it retries)."""
    STEPS[job.phase](world, worker, job)


# --- the mover and the poll ------------------------------------------------------------

def move_step(world: World, worker: Worker) -> None:
    """One step of the oldest move owed: Redis, one ``LMOVE`` from parking to the task's
    queue; other brokers get, publish, acknowledge (a crash between leaves two copies)."""
    move = worker.moves[0]
    source, target = parking_queue(move.key), main_queue(move.key)
    if world.protocol.lmove:
        if not world.broker.lmove(source, target):
            _moved_nothing(world, move.key)
        worker.moves.pop(0)
    elif move.phase == "get":
        move.delivery = world.broker.get(source, worker.life)
        move.phase = "publish"
        if move.delivery is None:
            _moved_nothing(world, move.key)
            worker.moves.pop(0)
    elif move.phase == "publish":
        assert move.delivery is not None
        wait = move.delivery.message.wait  # this copy's own id (copy_ids)
        wait = wait.but(move=f"m{next(world.broker.ids)}") if world.protocol.copy_ids else wait
        world.broker.publish(target, world.broker.copy(move.delivery.message, wait))
        world.count_copies(move.delivery.message.run)
        move.phase = "ack"
    else:
        assert move.delivery is not None
        world.broker.ack(move.delivery.tag)
        worker.moves.pop(0)


def _moved_nothing(world: World, key: str) -> None:
    if world.store.up:
        scripts.moved_nothing(world.store, key, world.now)


def due_poll(world: World, worker: Worker) -> None:
    """The fixed protocol's poll (each worker, ~100 ms): slots freed without a release
    are handed over, and this worker owes the moves."""
    if not (world.protocol.due_poll and world.store.up):
        return
    for key, moves in scripts.due(world.store, _parked(world), world.now).items():
        worker.moves += [Move(key) for _ in range(moves)]


def _parked(world: World) -> Dict[str, int]:
    return {key: world.broker.length(parking_queue(key)) for key in world.slots}


# --- faults and time -------------------------------------------------------------------

def crash(world: World, index: int) -> None:
    """Worker ``index`` dies whole: its bodies stop (counted as running until their
    leases could end), its deliveries wait for the broker to redeliver them."""
    worker = world.workers[index]
    for job in worker.jobs:
        run = job.message.run
        if job.phase in ("running", "ack_late") and job.message.acks_late:
            world.celery_reruns.add(run)     # Celery redelivers it and runs it again
        if job.phase == "running":
            assert job.body is not None
            job.body.killed = world.now
            if not job.message.acks_late:
                world.celery_lost.add(run)   # acknowledged: Celery's own loss
    world.dead.append(worker.life)
    world.workers[index] = world.new_worker()


def redeliver(world: World) -> None:
    """The broker gives back what dead workers held (visibility timeout, channel closed)."""
    for life in world.dead:
        world.broker.redeliver(life)
    world.dead.clear()


def tick(world: World, seconds: int) -> None:
    """Time passes; first every live admitted run renews its lease (well within it)."""
    assert seconds < scripts.LEASE and world.store.up
    for worker in world.workers:
        for job in worker.jobs:
            renewing = job.phase in ("ready", "running")
            if renewing and scripts.renew(world.store, job.message.key, job.holder,
                                          world.now):
                job.renewed = world.now
                if job.body is not None:
                    job.body.renewed = world.now
    world.now += seconds


# --- what must hold --------------------------------------------------------------------

def check_one_body(world: World, run: RunId) -> None:
    """At most one body per attempt, but where Celery itself runs one again (acks_late,
    killed before its acknowledgement), or where two copies of it met a loss of the
    store's data (stated in the design)."""
    earlier = world.bodies.get(run, [])
    allowed = run in world.celery_reruns or (world.data_lost and run in world.had_two_copies)
    assert not earlier or allowed, f"a second body of {run} (earlier: {earlier})"


def running(world: World, key: str) -> int:
    return sum(body.running(world.now) for bodies in world.bodies.values()
               for body in bodies if body.key == key)


def check_limits(world: World) -> None:
    for key, slots in world.slots.items():
        assert running(world, key) <= slots, (
            f"{running(world, key)} bodies of {key} running, {slots} slots")
