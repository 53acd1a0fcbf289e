"""One run of the history check: start the servers and the workers, send the seed's
tasks while its faults are injected, let everything settle, record the final states and
what the lock store still holds, and check the history."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from celery import Celery

from celery_redislock import Semaphore
from celery_redislock.config.settings import DEFAULT_LINE, Settings
from celery_redislock.engine.parked_view import read_parked_lines
from celery_redislock.parking.naming import PARKING_PREFIX

from .app import VISIBILITY_TIMEOUT, create_app
from .checker import FINAL_STATES, Verdict, check, classify_lost, collect_bodies
from .events import Recorder
from .faults import Injector, schedule
from .servers import Servers
from .workers import Workers
from .workload import KIND, KINDS, Send, plan

#: After the faults, how long the run may go without a body starting or ending before
#: the tasks not yet final are taken as lost: a killed worker's unacknowledged messages
#: come back after the visibility timeout, and a lock store that came back empty admits
#: nothing afresh for a grace of the longest lease (30 s).
SETTLE_QUIET = VISIBILITY_TIMEOUT + 60.0

#: The longest the settling may take whatever happens (s).
SETTLE_LIMIT = 1200.0


@dataclass
class Options:
    seed: int
    tasks: int = 300
    faults_for: float = 90.0
    persistence: str = "aof"
    pool: str = "prefork"
    log_directory: Optional[Path] = None
    #: The workers' ``redislock_line``; None: the package's default.
    line: Optional[str] = None
    #: The workers' ``redislock_gate``; None: the package's default.
    gate: Optional[str] = None


@dataclass
class Outcome:
    verdict: Verdict
    facts: Dict[str, Any] = field(default_factory=dict)
    log_directory: Optional[Path] = None


def run(options: Options) -> Outcome:
    """Carry out one run; its verdict, facts and, if kept, where the workers' logs are."""
    started = time.monotonic()
    logs = options.log_directory or Path(tempfile.mkdtemp(prefix="history-logs-"))
    servers = Servers(options.persistence)
    workers = Workers(servers.urls, logs, options.pool, line=options.line, gate=options.gate)
    try:
        record = Recorder(servers.urls.record)
        record.event("run", seed=options.seed, persistence=options.persistence,
                     pool=options.pool, tasks=options.tasks, faults_for=options.faults_for,
                     line=line_of(options), gate=gate_of(options), renewals=True)
        workers.start()
        app = create_app(servers.urls, options.line, options.gate)
        sent = drive(options, app, servers, workers, record)
        settle(app, servers, workers, record, sent)
        dump_lock_store(servers.lock_client(), logs / "lock-store.txt")
        history = record.history()
        verdict = check(history)
    finally:
        workers.stop()
        servers.stop()
    facts = {"seed": options.seed, "persistence": options.persistence, "pool": options.pool,
             "line": line_of(options), "gate": gate_of(options),
             "faults for (s)": options.faults_for,
             "wall time (s)": round(time.monotonic() - started, 1)}
    kept = None
    if verdict.defects() or options.log_directory:
        kept = logs
        (logs / "history.json").write_text("\n".join(json.dumps(e) for e in history) + "\n")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return Outcome(verdict, facts, kept)


def drive(options: Options, app: Celery, servers: Servers, workers: Workers,
          record: Recorder) -> List[str]:
    """Send the plan's tasks and inject the schedule's faults, each at its time; the ids
    of the tasks sent."""
    sends = plan(options.seed, options.tasks, options.faults_for)
    faults = schedule(options.seed, options.faults_for, quiet_end=VISIBILITY_TIMEOUT + 5)
    injector = Injector(servers, workers, record)
    sent: List[str] = []
    begin = time.monotonic()
    while sends or faults or time.monotonic() - begin < options.faults_for:
        now = time.monotonic() - begin
        while sends and sends[0].at <= now:
            sent.append(send(app, record, sends.pop(0)))
        if faults and faults[0].at <= now:
            injector.apply(faults.pop(0))
        injector.tick()
        for name in workers.exited():
            record.event("worker_exited", worker=name)
            workers.restart(name)
        time.sleep(0.01)
    injector.finish()
    return sent


def send(app: Celery, record: Recorder, send: Send) -> str:
    """Record that ``send``'s task is sent, then send it; its id."""
    kind = KIND[send.kind]
    task_id = uuid.uuid4().hex
    record.event("sent", task=task_id, name=send.name, acks_late=send.acks_late,
                 limits=kind.limits(send.key, send.cost), rate=kind.rate_limit(send.key))
    app.send_task(send.name, args=(send.key, send.seconds, send.cost), task_id=task_id)
    return task_id


def settle(app: Celery, servers: Servers, workers: Workers, record: Recorder,
           sent: List[str]) -> None:
    """Wait until every task is final (or lost by Celery's own default acks), record
    the final states, wait for the slots to come back, and record what the lock store
    still holds (the ``settle`` event)."""
    limit = time.monotonic() + SETTLE_LIMIT
    deadline, progress = time.monotonic() + SETTLE_QUIET, -1
    states: Dict[str, Any] = {}
    while time.monotonic() < min(deadline, limit):
        states = final_states(app, sent)
        if all(task in states for task in sent) or only_lost_by_celery(record, sent, states):
            break
        if record.bodies_seen() != progress:  # bodies still start or end: wait on
            deadline, progress = time.monotonic() + SETTLE_QUIET, record.bodies_seen()
        for name in workers.exited():
            record.event("worker_exited", worker=name)
            workers.restart(name)
        time.sleep(1.0)
    for task in sent:
        state, error = states.get(task, ("PENDING", ""))
        record.event("final", task=task, state=state, error=error)
    keys = [kind.key_of(index) for kind in KINDS if kind.slots for index in range(kind.keys)]
    lock = servers.lock_client()
    longest = max(kind.lease for kind in KINDS)
    held = wait_for_slots(lock, keys, longest + 10.0)
    no_ttl = [key.decode() for key in lock.scan_iter(count=1000) if lock.ttl(key) == -1]
    broker = servers.broker.client()  # kombu's Redis transport: messages not yet acked
    record.event("settle", held=held, no_ttl=no_ttl, broker_unacked=broker.hlen("unacked"),
                 unacked_tasks=unacked_tasks(broker), broker_queued=broker.llen("celery"),
                 parked=parked_leftovers(lock, broker, keys))


def unacked_tasks(broker: Any) -> List[str]:
    """The task ids of the messages in kombu's ``unacked`` hash (delivered to a worker,
    neither acknowledged nor restored yet): each entry is ``[message, exchange,
    routing key]`` as JSON, the message's headers naming its task."""
    found = []
    for raw in broker.hvals("unacked"):
        try:
            message = json.loads(raw)[0]
            found.append(str(message["headers"]["id"]))
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    return sorted(found)


def dump_lock_store(lock: Any, path: Path) -> None:
    """Write every key the lock store holds once settled, its type, time to live and
    value, into ``path`` (kept with the workers' logs)."""
    lines = []
    for key in sorted(lock.scan_iter(count=1000)):
        kind = lock.type(key).decode()
        read = {"string": lock.get, "hash": lock.hgetall, "list": lambda k: lock.lrange(k, 0, -1),
                "set": lock.smembers,
                "zset": lambda k: lock.zrange(k, 0, -1, withscores=True)}.get(kind)
        value = read(key) if read else "?"
        lines.append(f"{key.decode(errors='replace')} {kind} ttl={lock.pttl(key)} {value!r}")
    path.write_text("\n".join(lines) + "\n")


def gate_of(options: Options) -> str:
    """The gate the run's workers use: the option, else the package's default."""
    return options.gate or Settings.gate


def line_of(options: Options) -> str:
    """The line the run's workers use: the option, else the package's default."""
    return options.line or DEFAULT_LINE


def parked_leftovers(lock: Any, broker: Any, keys: List[str]) -> Dict[str, int]:
    """What the parking line still holds once settled: each parking list of the broker
    (a Redis broker: ``redislock.parking.*`` lists, priority lists and the list of
    unroutable copies included) that holds messages, and each of ``keys``'s parked line
    (in the lock store) whose runs waiting, anonymous entries, live reservations or claims
    are not zero. Empty when the line is clean, as it must be (and always on the store's
    line)."""
    found: Dict[str, int] = {}
    for name in broker.scan_iter(match=PARKING_PREFIX + "*", count=1000):
        if broker.type(name) == b"list" and broker.llen(name):
            found[f"broker list {name.decode(errors='replace')!r}"] = broker.llen(name)
    seconds, micros = lock.time()
    full = {Semaphore(lock, key).key: key for key in keys}
    for full_key, line in read_parked_lines(lock, list(full), seconds * 1000
                                            + micros // 1000).items():
        counts = {"waiting": line.references_waiting, "anonymous": line.anonymous,
                  "reserved": line.reserved, "claimed": line.claimed}
        for name, count in counts.items():
            if count:
                found[f"{full[full_key]}: parked line {name}"] = count
    return found


def final_states(app: Celery, tasks: List[str]) -> Dict[str, Any]:
    """Task id -> (state, exception name) of the tasks in a final state."""
    backend: Any = app.backend
    found: Dict[str, Any] = {}
    for first in range(0, len(tasks), 500):
        batch = tasks[first:first + 500]
        values = backend.mget([backend.get_key_for_task(task) for task in batch])
        for task, value in zip(batch, values):
            if value is None:
                continue
            meta = backend.decode_result(value)
            if meta["status"] in FINAL_STATES:
                error = type(meta["result"]).__name__ if meta["status"] == "FAILURE" else ""
                found[task] = (meta["status"], error)
    return found


def only_lost_by_celery(record: Recorder, sent: List[str], states: Dict[str, Any]) -> bool:
    """Whether every task not yet final is one Celery lost by its own default acks (its
    body killed with its whole worker): those never come back."""
    history = record.history()
    faults = [event for event in history if event["kind"] == "fault"]
    sends = {event["task"]: event for event in history if event["kind"] == "sent"}
    bodies = collect_bodies(history, faults)
    receipts = [event for event in history if event["kind"] == "received"]
    accepts = [event for event in history if event["kind"] == "accepted"]
    for task in sent:
        if task in states:
            continue
        mine = [body for body in bodies if body.task == task]
        if classify_lost(sends[task], mine, faults, receipts, accepts) != "celery":
            return False
    return True


def wait_for_slots(lock: Any, keys: List[str], timeout: float) -> Dict[str, int]:
    """Wait until no key of ``keys`` has a holder, at most ``timeout`` s; the holders
    each still has then."""
    deadline = time.monotonic() + timeout
    while True:
        held = {key: Semaphore(lock, key).holders() for key in keys}
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.5)
