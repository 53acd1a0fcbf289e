"""The Celery app of the fair-share benchmark (``bench_fair_share.py``), for workers and
sender, on the parking line (``redislock_line = "broker"``).

``REDISLOCK_BENCH_BROKER_URL`` broker, ``REDISLOCK_BENCH_LOCK_URL`` the lock store alone,
``REDISLOCK_BENCH_RECORD_URL`` records, ``REDISLOCK_BENCH_SLOTS`` the global cap. One
task, ``bench.fair.work(tenant, seconds, n)``: at most ``SLOTS`` at once over every
tenant, its line served round-robin across tenants (``fair_by``); each body pushes
``"<tenant> <n> <start µs> <end µs> <task id>"`` (the records server's clock) to
``bench:fair:runs``.

With ``REDISLOCK_BENCH_TRACE_DIR`` set, each worker process also appends to a file of
its own there, one line per event, ``"<event> <task id> <µs>"`` (the machine's clock,
the one the records server reads): ``received`` (the worker's main process has the
delivery), ``admitted`` (the lock store's time of the admission), ``dispatched`` (the
main process hands it to the pool), ``prerun`` (a pool process has it), ``released``
(the pool process gave the slot back, after the body), ``movestart`` and ``moved`` (its
mover took up and did the move the release owed), ``ended`` (the main process learned of
the run's end), ``swapped`` (a standby held there asks for the slot of a run that ended
there; ``redislock_standby``, on here unless ``REDISLOCK_BENCH_STANDBY=0``): the
parts of each hand-off (see ``bench_fair_share.handoff_parts``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import redis
from celery import Celery
from celery.signals import task_prerun, task_received

from celery_redislock import LimitedTask
from celery_redislock.integration.signals import lock_released

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
RECORD_ENV = "REDISLOCK_BENCH_RECORD_URL"
SLOTS_ENV = "REDISLOCK_BENCH_SLOTS"
WORK = "bench.fair.work"
GLOBAL = "fair:global"
RUNS = "bench:fair:runs"
SLOTS = int(os.environ.get(SLOTS_ENV, "4"))
GATE_ENV = "REDISLOCK_BENCH_GATE"
STANDBY_ENV = "REDISLOCK_BENCH_STANDBY"
TRACE_ENV = "REDISLOCK_BENCH_TRACE_DIR"

app = Celery("fair_share_app", broker=os.environ.get(BROKER_ENV, "memory://"),
             set_as_current=False)
app.conf.update(redislock_url=os.environ.get(LOCK_ENV, "redis://localhost:6379/15"),
                broker_connection_retry_on_startup=True, worker_prefetch_multiplier=1,
                task_ignore_result=True, redislock_line="broker",
                redislock_limits={WORK: [{"slots": SLOTS, "key": GLOBAL,
                                          "fair_by": "tenant:{tenant}", "lease": 60}]})
if os.environ.get(GATE_ENV):
    app.conf.redislock_gate = os.environ[GATE_ENV]
#: Standbys on unless ``REDISLOCK_BENCH_STANDBY=0`` (the package's default is off).
app.conf.redislock_standby = os.environ.get(STANDBY_ENV, "1") == "1"

_records: Dict[str, redis.Redis] = {}


def _record() -> redis.Redis:
    if "client" not in _records:
        _records["client"] = redis.Redis.from_url(os.environ[RECORD_ENV])
    return _records["client"]


@app.task(name=WORK, base=LimitedTask, bind=True)
def work(self: Any, tenant: str, seconds: float, n: int = 0) -> None:
    """``seconds`` in one of the global slots."""
    client = _record()
    started = _server_us(client)
    time.sleep(seconds)
    client.rpush(RUNS, f"{tenant} {n} {started} {_server_us(client)} {self.request.id}")
    lease = getattr(self.request, "redislock_lease", None)
    if lease is not None:
        _trace("admitted", self.request.id, int(lease.acquired_at_ms) * 1000)


def _server_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


_trace_files: Dict[int, Any] = {}


def _trace(event: str, task_id: Optional[str], at_us: Optional[int] = None) -> None:
    """Append ``"<event> <task id> <µs>"`` to this process's trace file, if tracing."""
    where = os.environ.get(TRACE_ENV)
    if not where or not task_id:
        return
    pid = os.getpid()
    out = _trace_files.get(pid)
    if out is None:
        # kept open for the process's life, one line buffered per event
        out = _trace_files[pid] = open(os.path.join(where, f"{pid}.trace"), "a",  # noqa: SIM115
                                       buffering=1)
    at = at_us if at_us is not None else int(time.time() * 1e6)
    out.write(f"{event} {task_id} {at}\n")


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    if request is not None and request.name == WORK:
        _trace("received", request.id)


@task_prerun.connect
def _prerun(task_id: Optional[str] = None, task: Any = None, **_: Any) -> None:
    if task is not None and task.name == WORK:
        _trace("prerun", task_id)


_last_released = {"task_id": None}


@lock_released.connect
def _released(task_id: Optional[str] = None, **_: Any) -> None:
    _last_released["task_id"] = task_id
    _trace("released", task_id)


def _trace_moves() -> None:
    """Trace when this process's mover takes up and ends each move (``movestart``,
    ``moved``), under the task id of the last run this process released."""
    from celery_redislock.parking.mover import Mover

    do = Mover._do

    def traced(self: Any, job: Any) -> Any:
        released = _last_released["task_id"] if job.kind == "move" else None
        _trace("movestart", released)
        try:
            return do(self, job)
        finally:
            _trace("moved", released)

    Mover._do = traced  # type: ignore[method-assign]


def _trace_dispatch() -> None:
    """Trace when the worker's main process hands a run to the pool (``dispatched``), and
    when it learns of a run's end (``ended``: the pool reported its result)."""
    from celery_redislock.gate import gate

    to_pool = gate._to_pool

    def traced(consumer: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request.name == WORK:
            _trace("dispatched", request.id)
        return to_pool(consumer, request, *args, **kwargs)

    gate._to_pool = traced  # type: ignore[assignment]

    succeeded = gate._RunEnd.succeeded

    def ended(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.request.name == WORK:
            _trace("ended", self.request.id)
        return succeeded(self, *args, **kwargs)

    gate._RunEnd.succeeded = ended  # type: ignore[method-assign]

    from celery_redislock.gate import standby

    marked = standby.marked

    def swapped(consumer: Any, request: Any, call: Any) -> Any:
        mine = standby.standbys_of(consumer, make=False)
        held = mine.copies.get(request.id) if mine is not None else None
        if held is not None and held.state is standby.State.SWAPPING:
            _trace("swapped", request.id)
        return marked(consumer, request, call)

    standby.marked = swapped  # type: ignore[assignment]

    take_slot = standby._take_slot

    def taken(consumer: Any, store: Any, key: str, held: Any, *args: Any) -> Any:
        _trace("swapped", held.request.id)
        return take_slot(consumer, store, key, held, *args)

    standby._take_slot = taken  # type: ignore[assignment]


if os.environ.get(TRACE_ENV):
    _trace_moves()
    _trace_dispatch()
