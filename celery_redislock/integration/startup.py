"""What a worker checks about its lock store as it starts.

A lock store that refuses the package (a wrong password, an ACL user lacking a command
or the package's keys, a Redis older than 6.2) stops the worker at start with the
server's message and what to do: at run time it would only make every limited run wait
for ever. A lock store that may evict keys (any ``maxmemory-policy`` but ``noeviction``)
is logged as a warning, or stops the worker when ``redislock_require_noeviction`` is
set. A lock store that cannot be reached at all does not stop the worker: it may start
before its lock store, and runs wait for it.

The check runs as a worker bootstep, added by :func:`~celery_redislock.install` and,
for apps with a ``LimitedTask``, when the worker initialises.
"""

from __future__ import annotations

import logging
from typing import Any, List, NoReturn

from celery import bootsteps
from celery.exceptions import WorkerShutdown
from redis.exceptions import RedisError

from ..config.settings import read_settings, redis_client
from ..engine.keys import semaphore_key
from ..engine.refusal import (
    eviction_warning,
    is_transient,
    lock_store_problems,
)
from ..engine.scripts import HOLDERS
from ..errors import LockStoreRefused

logger = logging.getLogger(__name__)

#: The semaphore the start check reads (it never writes it).
PROBE_NAME = "celery-redislock:start-check"


def check_lock_store(app: Any) -> None:
    """Raise :class:`LockStoreRefused` if ``app``'s lock store refuses the package, or
    may evict keys while ``redislock_require_noeviction`` is set; log a warning if it
    may evict keys otherwise.

    Example::

        check_lock_store(app)   # at deploy time, as a worker does when it starts
    """
    settings = read_settings(app)
    if not settings.enabled:
        return
    client = redis_client(app, settings)
    try:
        client.ping()
    except RedisError as exc:
        if is_transient(exc):  # it may start after the worker: runs wait for it (the
            return             # worker's start says so, see recovery.py)
    probe_key = semaphore_key(PROBE_NAME, settings.prefix)
    problems = lock_store_problems(client, lambda: HOLDERS.run(client, [probe_key], []))
    if problems:
        raise LockStoreRefused(
            "celery-redislock: the lock store refuses this worker: " + "; ".join(problems))
    warning = eviction_warning(client)
    if warning is None:
        return
    if settings.require_noeviction:
        raise LockStoreRefused(f"celery-redislock: {warning} (redislock_require_noeviction "
                               "is set, so this worker does not start)")
    logger.warning("celery-redislock: %s", warning)


class CheckLockStoreAtStart(bootsteps.Step):
    """Worker bootstep: refuse to start on a lock store that refuses the package."""

    name = "celery_redislock.check_lock_store"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        try:
            check_lock_store(worker.app)
        except LockStoreRefused as exc:
            refuse_to_start([str(exc).removeprefix("celery-redislock: ")])
        super().__init__(worker, **kwargs)


def refuse_to_start(problems: List[str]) -> NoReturn:
    """Stop a starting worker with one log line per problem and no traceback.

    ``WorkerShutdown`` is a ``SystemExit``: the worker exits with status 1 before its
    banner, and neither Celery nor Python prints a traceback for it.
    """
    for problem in problems:
        logger.critical("celery-redislock: worker not started: %s",
                        " ".join(problem.split()))
    raise WorkerShutdown(1)
