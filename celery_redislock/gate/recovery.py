"""Slots that a run could not give back itself, freed by the worker's main process.

A pool child killed by SIGKILL, the OOM killer, a hard ``time_limit`` or
``revoke(terminate=True)`` never runs its ``finally``. The worker's main process sees it
happen (``task_failure`` with ``WorkerLostError`` or ``TimeLimitExceeded``, or
``task_revoked`` with ``terminated=True``) and frees that run's slots at once, by the
holder token prefix ``"<worker node>|<task id>|<start id>:"``, instead of leaving them
until their leases run out.

Celery lets two workers share a node name, so a holder's owner is one *start* of a worker:
each start draws a random start id, registers itself in the lock store with a lease that
its lease keeper renews (see :mod:`celery_redislock.engine.workers`), and its runs' tokens
carry the start id. A worker that starts frees what its previous lives under the same node
name still held: the holders of that node whose start is not registered, or whose
registration names a process of this host that is gone (its registration is removed);
as its main process exits (after a warm or a cold shutdown) it frees what this start still
holds. Slots of other workers, and of a live worker of the same name, are never touched.
The receivers are connected when the package is imported; they act only in apps that use
``LimitedTask`` or ``install()``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import redis
from billiard.exceptions import WorkerLostError
from celery import Task
from celery.exceptions import TimeLimitExceeded
from celery.signals import task_failure, task_revoked, worker_init, worker_shutdown
from celery.worker import state as worker_state
from celery.worker.request import Request

from ..config.settings import read_settings, redis_client
from ..engine.admission import declare_longest_lease, owner_prefix
from ..engine.holder import parse_holder
from ..engine.keeper import lease_keeper
from ..engine.reach import unreachable_reason
from ..engine.scan import batches, semaphore_keys
from ..engine.scripts import RELEASE_OWNER, by_hash_slot, is_cluster
from ..engine.workers import (
    WorkerRegistration,
    live_starts,
    new_start_id,
    pid_runs,
    registry_prefix,
)
from ..line import handoff, moves
from ..pool.store_errors import not_given_back
from ..run.limited import limits_of, longest_lease, this_start, this_worker, uses_limits
from . import hand_on
from .startup import CheckAtStart, start_problems

logger = logging.getLogger(__name__)

def free_run_slots(task: Any, task_id: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                   worker: str, token: Optional[str] = None) -> int:
    """Free the slots that run ``task_id`` of ``task`` holds through worker ``worker``
    (or, for a slot handed on to it, see :mod:`.hand_on`, under holder ``token``), once
    the processes holding them have exited.

    Celery reports a hard time limit, and a terminating revoke, while the pool child may
    still be running (it is killed right after): freeing its slots then would let another
    run in beside it. So the slots are freed at once only when their holders' processes
    are gone, and otherwise by a thread that waits for them to exit (at most a lease).
    Returns how many slots were freed at once.
    """
    limits = limits_of(task)
    if limits is None:
        return 0
    settings = read_settings(task._get_app())
    slot_keys = limits.slot_keys(args or (), kwargs or {}, settings.prefix)
    if not slot_keys:
        return 0
    client = redis_client(task._get_app(), settings)
    prefix = token or owner_prefix(worker, task_id, this_start(worker))

    def free() -> int:
        return sum(free_owner_slots(task._get_app(), client, keys, prefix, limits.lease)
                   for keys in by_hash_slot(client, slot_keys))

    pids = holder_pids(client, slot_keys, prefix) + _accepted_pids(task_id)
    alive = [pid for pid in pids if process_alive(pid)]
    if not alive:
        return free()
    threading.Thread(
        target=_free_after_exit, args=(alive, limits.lease, free, f"{task.name}[{task_id}]"),
        name="celery-redislock-recovery", daemon=True,
    ).start()
    return 0


#: The requests of this worker that a pool process accepted, by task id, each as a weak
#: reference: a holder the worker's main process took for a run, and gives back itself,
#: names no process (see :data:`~.attempt.MAIN_RELEASES`); the request says which
#: process runs it. (A plain dictionary of weak references without callbacks, not a
#: ``WeakValueDictionary``, whose entries cost some six Python calls per run to make and
#: to drop: the dead ones are dropped in bulk, see :func:`_sweep_accepted`.)
_accepted: Dict[str, weakref.ref[Any]] = {}
#: How many entries :data:`_accepted` may hold before its dead ones are dropped.
_accepted_bound = [10_000]


def _note_accepted(request: Any) -> None:
    """Note ``request`` as accepted by a pool process (see :data:`_accepted`)."""
    _accepted[request.id] = weakref.ref(request)
    if len(_accepted) > _accepted_bound[0]:
        _sweep_accepted()


def _sweep_accepted() -> None:
    """Drop the dead entries of :data:`_accepted`, which has more than its bound; the
    bound is then twice the live ones, at least 10,000 (a sweep every so many runs)."""
    for task_id, ref in list(_accepted.items()):
        if ref() is None:
            _accepted.pop(task_id, None)
    _accepted_bound[0] = max(10_000, 2 * len(_accepted))


def _accepted_pids(task_id: str) -> List[int]:
    ref = _accepted.get(task_id)
    pid = getattr(None if ref is None else ref(), "worker_pid", None)
    return [pid] if isinstance(pid, int) and pid != os.getpid() else []


def holder_pids(client: Any, keys: Sequence[str], prefix: str) -> List[int]:
    """The process ids written in the descriptions of the holders whose entry starts
    with ``prefix``."""
    holders = (parse_holder(member, score) for key in keys
               for member, score in client.zrangebyscore(key, 0, "+inf", withscores=True))
    return [holder.pid for holder in holders
            if holder.token.startswith(prefix) and holder.pid is not None]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs on this machine (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return pid_runs(pid)


def _free_after_exit(pids: List[int], lease: float, free: Any, what: str) -> None:
    deadline = time.monotonic() + lease
    while any(process_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            logger.warning("celery-redislock: %s: process(es) %s still run after a whole "
                           "lease; its slots come back when its lease ends", what, pids)
            return
        time.sleep(0.01)
    _free_saying(free, f"of {what} once its process exited")


def free_owner_slots(app: Any, client: Any, keys: Sequence[str], prefix: str,
                     lease: float = handoff.RESERVATION, mode: Sequence[str] = ()) -> int:
    """Free the slots of ``keys`` whose holder tokens start with ``prefix`` (and that
    ``mode`` selects, see ``release_owner.lua``), hand them to their parked lines (the
    moves owed go to this process's mover), and return how many were freed."""
    reply = RELEASE_OWNER.run(client, list(keys),
                              [prefix, handoff.reservation_ms(lease), *mode])
    if len(reply) > 1:
        handoff.publish(app, reply[1:])
    return int(reply[0])


def free_worker_slots(app: Any, worker: str, live: Sequence[str] = ()) -> int:
    """Free, on any key, the slots held by runs of worker ``worker`` (a node name) whose
    start is neither registered nor in ``live``: the dead lives of that worker."""
    settings = read_settings(app)
    client = redis_client(app, settings)
    registry = "" if is_cluster(client) else registry_prefix(settings.prefix, worker)
    return _free_on_every_key(app, worker, ["dead", registry, *live])


def free_start_slots(app: Any, worker: str, start: str) -> int:
    """Free, on any key, the slots held by runs of start ``start`` of worker ``worker``."""
    return _free_on_every_key(app, worker, ["own", start])


def _free_on_every_key(app: Any, worker: str, mode: Sequence[str]) -> int:
    """Free the slots of worker ``worker`` that ``mode`` selects on every semaphore key."""
    settings = read_settings(app)
    client = redis_client(app, settings)
    return sum(free_owner_slots(app, client, keys, owner_prefix(worker), mode=mode)
               for batch in batches(semaphore_keys(client, settings.prefix))
               for keys in by_hash_slot(client, batch))


@worker_init.connect
def _forget_previous_life(sender: Any = None, **_: Any) -> None:
    app, worker = getattr(sender, "app", None), getattr(sender, "hostname", None)
    if app is None or not worker:
        return
    start = new_start_id()
    this_worker.update(name=worker, start=start)
    try:
        if not uses_limits(app):
            return
    except Exception as exc:  # never stop a worker from starting over this
        logger.warning("celery-redislock: could not look at the tasks of %s: %r", worker, exc)
        return
    app.steps["worker"].add(CheckAtStart)  # runs as the worker's blueprint is made
    if start_problems(sender):
        return  # the worker does not start: that step says why, and nothing else is done
    registration = _register(app, worker, start)
    atexit.register(_free_what_is_left, app, worker, start, os.getpid(), registration)
    _free_worker_slots_saying(app, worker, AT_START, lambda: free_worker_slots(
        app, worker, [*live_starts(redis_client(app), read_settings(app).prefix, worker),
                      start]))


#: How the start-up call of :func:`_free_worker_slots_saying` names the slots it frees.
AT_START = "still held by a previous run of"


def _free_worker_slots_saying(app: Any, worker: str, whose: str,
                              free: Callable[[], int]) -> None:
    """:func:`_free_saying` for slots of worker ``worker``; at start, an unreachable lock
    store is said as such (once)."""
    def said(exc: BaseException) -> bool:
        if whose != AT_START or not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            return False
        log_unreachable_lock_store(app, exc)
        return True

    _free_saying(free, f"{whose} {worker}", logging.WARNING, said)


def _free_saying(free: Callable[[], int], whose: str, level: int = logging.INFO,
                 said: Callable[[BaseException], bool] = lambda exc: False) -> None:
    """Call ``free`` (it frees slots, ``whose``, and counts them), logging how many at
    ``level``; it never raises: a failure (unless ``said`` said it) is
    :func:`~..pool.store_errors.not_given_back`'s, and the slots come back when their
    leases end."""
    try:
        freed = free()
    except Exception as exc:
        if not said(exc):
            not_given_back(whose, exc)
        return
    if freed:
        logger.log(level, "celery-redislock: freed %d slot(s) %s", freed, whose)


def _register(app: Any, worker: str, start: str) -> Optional[WorkerRegistration]:
    """Register this start of ``worker`` and have the lease keeper keep it alive."""
    client = redis_client(app)
    grace = longest_lease(app)
    declare_longest_lease(client, grace)
    registration = WorkerRegistration(client, read_settings(app).prefix, worker, start,
                                      grace=grace)
    try:
        registration.renew()
    except Exception as exc:  # the keeper registers it once the lock store answers
        logger.warning("celery-redislock: could not register %s (start %s): %r",
                       worker, start, exc)
    lease_keeper().keep(registration)
    this_worker["registration"] = registration
    return registration


@worker_shutdown.connect
def _stop_renewing_registration(sender: Any = None, **_: Any) -> None:
    registration = this_worker.get("registration")
    if registration is not None and getattr(sender, "hostname", None) == registration.node:
        lease_keeper().forget(registration)


def log_unreachable_lock_store(app: Any, exc: BaseException) -> None:
    """One ERROR line: which lock store could not be reached, why, and what runs do now."""
    settings = read_settings(app)
    then = ("limited tasks run WITHOUT limits until it can (redislock_fail_open)"
            if settings.fail_open else
            "limited tasks wait, re-queued, until it can (fail-closed)")
    logger.error("celery-redislock: lock store %s; %s: check redislock_url",
                 unreachable_reason(redis_client(app, settings), exc), then)


def _free_for_dead_run(task: Any, task_id: str, args: Any, kwargs: Any, why: str) -> None:
    worker = this_worker.get("name") or getattr(getattr(task, "request", None), "hostname", None)
    if not worker or task is None:
        return
    _free_saying(lambda: free_run_slots(task, task_id, args, kwargs, worker,
                                        token=hand_on.token_of(task_id)),
                 f"of {task.name}[{task_id}] ({why})")


#: Where :class:`LimitedRequest` is, as Celery's ``Task.Request`` names a request class.
LIMITED_REQUEST = "celery_redislock.gate.recovery:LimitedRequest"

#: Where the strategy of limited tasks is (see :mod:`.gate`), and Celery's default one.
LIMITED_STRATEGY = "celery_redislock.gate.gate:limited_strategy"
DEFAULT_STRATEGY = Task.Strategy

#: Celery's own request class, as ``Task.Request`` names it by default.
DEFAULT_REQUEST = Task.Request


class LimitedRequest(Request):
    """The worker-side request of limited tasks: when the pool child running it is lost
    (SIGKILL, the OOM killer), the worker's main process frees its slots on every path.

    Celery sends ``task_failure`` for a lost child only when it does not requeue the
    message; with ``acks_late`` and ``reject_on_worker_lost`` it rejects the message
    for redelivery and sends nothing, so the slots would wait for their lease to run
    out. ``LimitedTask`` uses this class (``Task.Request``), and so do plain tasks that
    ``redislock_limits`` names, unless they have a request class of their own.
    """

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
        exc = exc_info.exception
        exc = getattr(exc, "exc", exc)  # billiard wraps it in an ExceptionWithTraceback
        if isinstance(exc, WorkerLostError):
            _free_for_dead_run(self.task, self.id, self.args, self.kwargs, "WorkerLostError")
        return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                  return_ok=return_ok)


    def on_accepted(self, pid: Any, time_accepted: Any) -> None:
        """Started in a pool process: this run is the one that ``revoke`` must find by
        its id, whatever copy of its message (sent back to wait) a worker holds."""
        super().on_accepted(pid, time_accepted)
        worker_state.requests[self.id] = self
        _note_accepted(self)

    def terminate(self, pool: Any, signal: Any = None) -> None:
        """``revoke(terminate=True)`` found this request by its id; a copy of a waiting
        run's message may stand for the id while the run itself is active here: the
        active run is terminated too."""
        for other in list(worker_state.active_requests):
            if other.id == self.id and other is not self:
                other.terminate(pool, signal)
        super().terminate(pool, signal)

    def _announce_revoked(self, reason: Any, terminated: Any, signum: Any,
                          expired: Any) -> None:
        """A task that waited has several copies of its message (the one sent back to
        wait, the one sent when it was handed a slot): each reaches a worker that knows
        the id is revoked. Only the first announces it (``task_revoked``, the
        ``task-revoked`` event, the REVOKED state); the others are acknowledged quietly."""
        if _first_revocation(self.task, self.id):
            super()._announce_revoked(reason, terminated, signum, expired)
            return
        forget_copy(self)
        self.acknowledge()
        self._already_revoked = True
        logger.debug("celery-redislock: task %s[%s]: another copy of a revoked run, "
                     "dropped", self.task.name, self.id)


def forget_copy(request: Any) -> None:
    """Take a request that ends without running out of the worker's state, as Celery's
    ``task_ready`` does, without taking away the entry by which ``revoke`` finds another
    request of the same task id that runs here."""
    worker_state.reserved_requests.discard(request)
    worker_state.active_requests.discard(request)
    scheduled = getattr(worker_state, "scheduled_requests", None)  # Celery >= 5.5
    if scheduled is not None:
        scheduled.discard(request)
    if worker_state.requests.get(request.id) is request:
        del worker_state.requests[request.id]
    for other in worker_state.active_requests:
        if other.id == request.id:
            worker_state.requests[request.id] = other
            break


#: How long (ms) the lock store remembers that a revoked task's revocation was announced.
REVOCATION_MEMORY_MS = 24 * 3600 * 1000


def _first_revocation(task: Any, task_id: str) -> bool:
    """Whether this is the first announcement of the revocation of ``task_id`` (one
    ``SET NX``; True when the task is not limited or the lock store cannot say)."""
    if limits_of(task) is None:
        return True
    try:
        settings = read_settings(task._get_app())
        if not settings.enabled:
            return True
        client = redis_client(task._get_app(), settings)
        return bool(client.set(f"{settings.prefix}revoked:{task_id}", "1", nx=True,
                               px=REVOCATION_MEMORY_MS))
    except Exception:  # a revocation is announced rather than lost
        return True


def _frees_lost_runs_itself(task: Any) -> bool:
    request_class = getattr(task, "Request", None)
    return request_class == LIMITED_REQUEST or (
        isinstance(request_class, type) and issubclass(request_class, LimitedRequest))


@task_failure.connect
def _on_task_failure(sender: Any = None, task_id: Optional[str] = None, exception: Any = None,
                     args: Any = None, kwargs: Any = None, **_: Any) -> None:
    if not task_id:
        return
    lost = isinstance(exception, WorkerLostError) and not _frees_lost_runs_itself(sender)
    if lost or isinstance(exception, TimeLimitExceeded):
        _free_for_dead_run(sender, task_id, args, kwargs, type(exception).__name__)


@task_revoked.connect
def _on_task_revoked(sender: Any = None, request: Any = None, terminated: bool = False,
                     **_: Any) -> None:
    if request is None:
        return
    if terminated:
        _free_for_dead_run(sender, request.id, request.args, request.kwargs, "terminated")
    elif limits_of(sender) is not None:
        moves.leave_soon(sender._get_app(), getattr(request, "_context", request))


def _free_what_is_left(app: Any, worker: str, start: str, main_pid: int,
                       registration: Optional[WorkerRegistration] = None) -> None:
    """At the exit of the worker's main process — after a warm or a cold shutdown, whose
    pool children were killed without their ``finally`` — free what this start of the
    worker still holds, then remove its registration. (Pool children inherit this hook
    through ``fork``; only the main process runs it.)"""
    if os.getpid() != main_pid:
        return

    def free_and_leave() -> int:
        freed = free_start_slots(app, worker, start)
        if registration is not None:
            lease_keeper().forget(registration)
            registration.unregister()
        return freed

    _free_worker_slots_saying(app, worker, "left by", free_and_leave)
