"""What a worker checks about its lock store as it starts.

A lock store that refuses the package (a wrong password, an ACL user lacking a command
or the package's keys, a Redis older than 6.2) stops the worker at start with the
server's message and what to do: at run time it would only make every limited run wait
for ever. A lock store that may evict keys (any ``maxmemory-policy`` but ``noeviction``)
is logged as a warning, or stops the worker when ``redislock_require_noeviction`` is
set. A lock store that cannot be reached at all does not stop the worker: it may start
before its lock store, and runs wait for it.

The check runs as a worker bootstep, added by :func:`~celery_redislock.install` and,
for apps with a ``LimitedTask``, when the worker initialises; the same bootstep stops a
worker whose limits are misconfigured (a bad ``redislock_limits`` entry, a misspelt task
option, a key naming an argument the task lacks, a bad rate), one line per problem.
"""

from __future__ import annotations

import logging
from typing import Any, List, NoReturn, Optional, Tuple

from celery import bootsteps
from celery.exceptions import WorkerShutdown
from redis.exceptions import RedisError

from ..config.limits_setting import configuration_problems
from ..config.settings import RETIRED_LINE, read_settings, redis_client
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
    warning = lock_store_warning(app)
    if warning is not None:
        logger.warning("celery-redislock: %s", warning)


def lock_store_warning(app: Any) -> Optional[str]:
    """What :func:`check_lock_store` would warn of (None: nothing), without logging it;
    :class:`LockStoreRefused` as it raises."""
    settings = read_settings(app)
    if not settings.enabled:
        return None
    client = redis_client(app, settings)
    try:
        client.ping()
    except RedisError as exc:
        if is_transient(exc):  # it may start after the worker: runs wait for it (the
            return None        # worker's start says so, see recovery.py)
    probe_key = semaphore_key(PROBE_NAME, settings.prefix)
    problems = lock_store_problems(client, lambda: HOLDERS.run(client, [probe_key], []))
    if problems:
        raise LockStoreRefused(
            "celery-redislock: the lock store refuses this worker: " + "; ".join(problems))
    warning = eviction_warning(client)
    if warning is not None and settings.require_noeviction:
        raise LockStoreRefused(f"celery-redislock: {warning} (redislock_require_noeviction "
                               "is set, so this worker does not start)")
    return warning


#: What a worker whose app names the retired ``redislock_line = "store"`` logs as it
#: starts.
STORE_LINE_DEPRECATED = (
    'redislock_line = "store" is retired and ignored: the old line (a countdown copy in '
    'the broker and a parked message in the lock store) is gone. Refused runs wait on '
    'the parking line, as one message in a parking queue of the broker; remove the '
    'setting')


def line_deprecation(app: Any) -> Optional[str]:
    """The warning a worker logs as it starts when its app names the retired ``"store"``
    line (None: it does not, or the package is switched off).

        >>> from celery import Celery
        >>> line_deprecation(Celery(set_as_current=False)) is None  # the default: "broker"
        True
        >>> old = Celery(set_as_current=False)
        >>> old.conf.redislock_line = "store"
        >>> line_deprecation(old).startswith('redislock_line = "store" is retired')
        True
    """
    named = app.conf.get("redislock_line")
    if named == RETIRED_LINE and read_settings(app).enabled:
        return STORE_LINE_DEPRECATED
    return None


def start_problems(worker: Any) -> List[str]:
    """Why ``worker`` must not start, one sentence each (none: ``[]``): every problem of
    its app's limits (:func:`~celery_redislock.config.limits_setting.configuration_problems`:
    the ``redislock_*`` settings and every limited task's options), else a lock store that
    refuses the package (:func:`check_lock_store`).

    Worked out once per worker start (the worker's ``worker_init`` and its bootsteps
    share the answer, so the lock store is asked, and an eviction warned of, once).
    """
    return list(_start_check(worker)[0])


def _start_check(worker: Any) -> Tuple[Tuple[str, ...], Optional[str]]:
    """(the problems, the lock store's warning) of :func:`start_problems`, cached."""
    cached = getattr(worker, _CACHE, None)
    if cached is not None:
        return cached
    problems = configuration_problems(worker.app)
    warning = None
    if not problems:
        try:
            warning = lock_store_warning(worker.app)
        except LockStoreRefused as exc:
            problems = [str(exc).removeprefix("celery-redislock: ")]
    found = (tuple(problems), warning)
    setattr(worker, _CACHE, found)
    return found


_CACHE = "_redislock_start_check"


class CheckAtStart(bootsteps.Step):
    """Worker bootstep: refuse to start, one CRITICAL line per problem, when the limits
    are misconfigured or the lock store refuses the package (:func:`start_problems`)."""

    name = "celery_redislock.check_at_start"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        problems, warning = _start_check(worker)
        if problems:
            refuse_to_start(list(problems))
        if warning is not None:  # logged here, once the worker's logging is set up
            logger.warning("celery-redislock: %s", warning)
        deprecated = line_deprecation(worker.app)
        if deprecated is not None:
            logger.warning("celery-redislock: %s", deprecated)
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
