"""What a failed call to the lock store means for a run: how it is logged and counted
(``lock_store_error``), what an eager run raises for it, and what it means for slots
being given back (:func:`not_given_back`, every way of giving them back).

    >>> type(eager_store_error("crawl", ConnectionError("down"))).__name__
    'LockStoreUnavailable'
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

from ..engine.refusal import TRANSIENT, describe_error, error_kind, error_text, server_message
from ..errors import LockStoreFull, LockStoreRefused, LockStoreUnavailable
from ..run import signals

logger = logging.getLogger(__name__)


def report_store_error(task: Any, task_id: Any, names: str, exc: BaseException) -> None:
    """Log a failed call to the lock store for a run, by what it means, with the server's
    message, and send ``lock_store_error``. An outage is logged at DEBUG (the worker said
    at start where the store is), a fail-over or a server loading its data is a warning:
    runs wait for them. A full store or a refusal is an
    error: it will not pass by itself."""
    kind = error_kind(exc)
    if kind == "unreachable":  # the worker said at start where the store is; the
        logger.debug("celery-redislock: task %s[%s]: %s, for %s",  # deferral is at INFO
                     task.name, task_id, describe_error(exc), names)
    elif kind in TRANSIENT:
        logger.warning("celery-redislock: task %s[%s]: %s, for %s; it waits as for an outage",
                       task.name, task_id, describe_error(exc), names)
    else:
        logger.error("celery-redislock: task %s[%s]: %s, for %s; the run waits (never run "
                     "without its limit) until this is fixed", task.name, task_id,
                     describe_error(exc), names)
    signals.lock_store_error.send(sender=task, task_id=task_id, key=names, kind=kind,
                                  message=server_message(exc))


#: What becomes of slots that could not be given back, said after the error.
LEASE_ENDS = "they come back when their lease ends"


def not_given_back(whose: str, exc: BaseException, then: str = LEASE_ENDS, *,
                   task: Any = None, task_id: Any = None, key: str = "") -> None:
    """What a failed call giving back slots (``whose``) means, however they were being
    given back: a warning, for they come back by themselves (``then``: how); a Redis
    error that will not pass by itself is also sent as ``lock_store_error`` (``task``).

        >>> not_given_back("of 'crawl'", ConnectionError("down"))  # logged only
    """
    logger.warning("celery-redislock: could not give back the slots %s (%s); %s", whose,
                   error_text(exc), then)
    if task is not None and isinstance(exc, RedisError) and error_kind(exc) not in TRANSIENT:
        signals.lock_store_error.send(sender=task, task_id=task_id, key=key,
                                      kind=error_kind(exc), message=server_message(exc))


def eager_store_error(task_name: str, exc: BaseException) -> LockStoreUnavailable:
    """The exception an eager run raises for a failed call to the lock store."""
    kind = error_kind(exc)
    if kind == "full":
        return LockStoreFull(f"Task {task_name!r}: the lock store is full: "
                             f"{server_message(exc)}")
    if kind in TRANSIENT:
        return LockStoreUnavailable(f"Task {task_name!r}: the lock store is unreachable: "
                                    f"{server_message(exc)}")
    return LockStoreRefused(f"Task {task_name!r}: {describe_error(exc)}")
