"""Unique tasks at enqueue (``lock_unique``), and the run of a task with task-wide options.

**Unique.** While a task with the same key is queued or running, sending it again does
not enqueue a second one: the send returns the queued task's ``AsyncResult``
(``lock_unique=True``) or raises :class:`~celery_redislock.AlreadyQueued`
(``lock_unique="raise"``). The lock is a lease owned by the task id
(:class:`~celery_redislock.engine.owned.OwnedLease`): taken by the send for
``lock_unique_lease`` seconds (plus its countdown), held by the run on its own
``lock_lease`` and renewed by the lease keeper while the body runs, deleted (if the task
id still owns it) when the body ends however it ends — except by the task's own
``self.retry()``, whose re-send keeps it for the queue again. Re-sends of the same task id
(``self.retry()``, the package's own re-queueing of a waiting run) always go out::

    @app.task(base=LimitedTask, lock_unique=True, lock_key="report:{account_id}")
    def build_report(account_id): ...

    first = build_report.delay(7)
    assert build_report.delay(7).id == first.id      # while it is queued or running

The run side also checks ``lock_period`` (see :mod:`.period`): :func:`run_task` is what
a limited task's ``__call__`` runs.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from celery.exceptions import Retry
from celery.signals import task_revoked
from kombu.utils.uuid import uuid
from redis.exceptions import RedisError

from ..config.limit import TaskLimits
from ..config.settings import redis_client
from ..config.unique import UniqueRule
from ..engine.keeper import lease_keeper
from ..engine.keys import unique_key
from ..engine.owned import OwnedLease
from ..errors import AlreadyQueued, LockStoreUnavailable
from ..pool.pool_process import run_limited
from ..run.limited import task_settings
from ..run.waiting_run import carries_wait
from .period import Deferred, check_period

logger = logging.getLogger(__name__)


def _client(task: Any) -> Any:
    client = task.__dict__.get("_redislock_owned_client")
    if client is None:
        client = task.__dict__["_redislock_owned_client"] = redis_client(
            task._get_app(), task_settings(task))
    return client


def _delay_of(options: Mapping[str, Any]) -> float:
    """How long the message waits in the broker before it may run (its countdown or ETA)."""
    countdown = options.get("countdown")
    if isinstance(countdown, (int, float)) and not isinstance(countdown, bool):
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if isinstance(eta, str):
        try:
            eta = datetime.datetime.fromisoformat(eta)
        except ValueError:
            return 0.0
    if isinstance(eta, datetime.datetime):
        now = datetime.datetime.now(eta.tzinfo) if eta.tzinfo else datetime.datetime.now()
        return max(0.0, (eta - now).total_seconds())
    return 0.0


def _is_resend(task: Any, task_id: str, options: Mapping[str, Any]) -> bool:
    """A message of a run that was sent already: the task's own ``self.retry()`` from its
    body, or the package re-queueing a waiting run (its message has the wait header)."""
    headers = options.get("headers")
    if carries_wait(headers):
        return True
    request = task.request
    return not request.called_directly and request.id == task_id


def send_unique(task: Any, rule: UniqueRule, send: Callable[..., Any],
                args: Optional[Sequence[Any]], kwargs: Optional[Mapping[str, Any]],
                options: Dict[str, Any]) -> Any:
    """``apply_async`` of a task with ``lock_unique``: send it unless a task of the same
    key is queued or running; then return that task's result or raise ``AlreadyQueued``."""
    settings = task_settings(task)
    if not settings.enabled or task.app.conf.task_always_eager:
        return send(args, kwargs, **options)
    name = rule.key.render(tuple(args or ()), dict(kwargs or {}))
    task_id = options.get("task_id") or uuid()
    options["task_id"] = task_id
    resend = _is_resend(task, task_id, options)
    lock = OwnedLease(_client(task), unique_key(name, settings.prefix), name, task_id,
                      rule.queue_lease + _delay_of(options))
    try:
        holder = lock.take()
    except RedisError as exc:
        if not (resend or settings.fail_open):
            raise LockStoreUnavailable(
                f"Task {task.name!r}: the lock store is unreachable, so the unique key "
                f"{name!r} cannot be checked: {exc}") from exc
        logger.warning("celery-redislock: task %s[%s] sent WITHOUT checking its unique key "
                       "%r: the lock store is unreachable (%r)", task.name, task_id, name, exc)
        return send(args, kwargs, **options)
    if holder is not None and not resend:
        if rule.mode == "raise":
            raise AlreadyQueued(name, holder, task.name)
        logger.debug("celery-redislock: task %s of %r is queued or running already: %s",
                     task.name, name, holder)
        return task.AsyncResult(holder)
    try:
        return send(args, kwargs, **options)
    except BaseException:
        if not resend:  # a re-send's earlier message may still be queued: keep the key
            with contextlib.suppress(RedisError):  # else it runs out with its lease
                lock.release()  # nothing was sent: the key is free again
        raise


def run_task(task: Any, limits: TaskLimits, args: Sequence[Any], kwargs: Mapping[str, Any],
             body: Callable[[], Any], request: Any) -> Any:
    """Run ``body`` for ``request`` under ``limits``: its slots and rates (if any) first,
    then its period, then its unique lock held while ``body`` runs."""
    if limits.unique is not None or limits.period is not None:
        if task_settings(task).enabled:
            body = _guarded(task, limits, args, kwargs, body, request)
        if not limits.rules:
            return body()
    return run_limited(task, limits, args, kwargs, body, request)


def _guarded(task: Any, limits: TaskLimits, args: Sequence[Any], kwargs: Mapping[str, Any],
             body: Callable[[], Any], request: Any) -> Callable[[], Any]:
    period = limits.period
    if period is not None:
        unchecked = body

        def body() -> Any:
            check_period(task, period, args, kwargs, request)
            return unchecked()

    def guarded() -> Any:
        if limits.unique is None:
            return body()
        return _hold_unique(task, limits, args, kwargs, body, request)

    return guarded


def _hold_unique(task: Any, limits: TaskLimits, args: Sequence[Any],
                 kwargs: Mapping[str, Any], body: Callable[[], Any], request: Any) -> Any:
    """Hold the unique lock on the run's lease while ``body`` runs; give it up after,
    unless the run was sent again (its own ``self.retry()``, or deferred to the end of its
    period): its re-send took the lock for the queue, which it keeps."""
    assert limits.unique is not None
    settings = task_settings(task)
    name = limits.unique.key.render(args, kwargs)
    lock = OwnedLease(_client(task), unique_key(name, settings.prefix), name,
                      request.id or "", limits.lease)
    kept = False
    try:
        holder = lock.take()
        kept = holder is None
        if holder is not None:
            logger.info("celery-redislock: task %s[%s] runs while %s holds its unique key %r "
                        "(its own lock ran out while it was queued)",
                        task.name, request.id, holder, name)
    except RedisError as exc:
        logger.warning("celery-redislock: task %s[%s] could not hold its unique key %r (%r)",
                       task.name, request.id, name, exc)
    if kept:
        lease_keeper().keep(lock)
    queued_again: Optional[float] = None
    try:
        return body()
    except Retry as exc:
        when = exc.when
        queued_again = _delay_of({"eta": when} if isinstance(when, datetime.datetime)
                                 else {"countdown": when})
        raise
    except Deferred as exc:
        queued_again = exc.countdown
        raise
    finally:
        if kept:
            lease_keeper().forget(lock)
            _let_go(task, lock, limits.unique.queue_lease, queued_again)


def _let_go(task: Any, lock: OwnedLease, queue_lease: float,
            queued_again: Optional[float]) -> None:
    try:
        if queued_again is None:
            lock.release()
        else:
            lock.renew(queue_lease + queued_again)  # queued again, with this countdown
    except RedisError as exc:
        logger.warning("celery-redislock: task %s[%s] could not give up its unique key %r "
                       "(%r); it runs out within %.0f s", task.name, lock.owner, lock.name,
                       exc, lock.lease_seconds)


@task_revoked.connect
def _release_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A revoked task never runs (or was terminated): its unique key is free at once,
    where the worker that drops it can compute the key."""
    task_limits = getattr(sender, "task_limits", None)
    if task_limits is None or request is None or not request.id:
        return
    try:
        unique = task_limits().unique
        if unique is None or not task_settings(sender).enabled:
            return
        name = unique.key.render(tuple(request.args or ()), dict(request.kwargs or {}))
        OwnedLease(_client(sender), unique_key(name, task_settings(sender).prefix), name,
                   request.id, unique.queue_lease).release()
    except Exception as exc:  # the lease runs out by itself
        logger.warning("celery-redislock: could not free the unique key of revoked task "
                       "%s[%s] (%r)", getattr(sender, "name", "?"), request.id, exc)
