"""What the lock store's scripts hand over as they free slots: the moves owed out of
parking queues (the parking line; see :mod:`.broker_line`), owed by this process's
mover, and how long a slot handed over stays reserved.

The old line's parked messages (a second copy of a waiting run's message, kept in the
lock store and re-published as an *express copy* when its ticket was handed a slot) are
retired: a worker never writes one and never sends one. A message a worker of an earlier
release parked in the lock store and that a script hands over is dropped unread: logged
as an error naming where it was read, counted (signal ``lock_store_error``, kind
``rejected_entry``) and taken out of its line; its run's waiting copy, in the broker,
carries on.

    >>> reservation_ms(30.0), reservation_ms(2.5)
    (10000, 2500)
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Tuple

from ..config.settings import read_settings, redis_client
from ..engine.keys import companion_key
from ..engine.scripts import LEAVE_LINE, WAKE
from . import broker_line, signals

logger = logging.getLogger(__name__)


#: How long a slot handed to the line is kept for it (seconds, at most the lease): time
#: for the run moved out of its parking queue to reach a worker.
RESERVATION = 10.0


def reservation_ms(lease: float) -> int:
    """How long (ms) a slot handed to the line stays reserved, for a given lease."""
    return max(1, round(min(RESERVATION, lease) * 1000))


class RejectedEntry(Exception):
    """A message found in the lock store, which a worker never sends."""


def where_from(message: Any) -> Tuple[str, str]:
    """Where a handed-over message was read (``"<hash key> m:<ticket>"``, or "" when
    the script did not say) and the message itself."""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "surrogateescape")
    if message.startswith("@"):
        where, _, message = message.partition("\n")
        return where[1:], message
    return "", message


def publish(app: Any, messages: Iterable[Any]) -> int:
    """Owe the moves out of parking lines that a script handed over (see
    :func:`.broker_line.owe`); returns 0: a message kept in the lock store (by a worker
    of an earlier version, on its "store" line) is never sent nor decoded: it is logged
    as an error naming where it was read, counted (signal ``lock_store_error``, kind
    ``rejected_entry``) and taken out of its line. Its run's waiting copy is still in
    the broker, so no task is lost by it.
    """
    messages, moves = broker_line.split(messages)
    if moves:
        broker_line.owe(app, moves)
    for message in messages:  # the parking line keeps no messages in the lock store
        _reject(app, message, RejectedEntry(
            "a worker on the parking line runs nothing kept in the lock store"))
    return 0


def _reject(app: Any, message: Any, exc: Exception) -> None:
    """Log, count and drop a message found in the lock store."""
    where, _ = where_from(message)
    reason = str(exc) if isinstance(exc, RejectedEntry) else f"it cannot be decoded: {exc!r}"
    logger.error("celery-redislock: dropped the parked message %s from the lock store, never "
                 "run: %s. A worker of an earlier release (its \"store\" line) or someone who "
                 "can write to the lock store put it there", where or "(place unknown)", reason)
    signals.lock_store_error.send(sender=app, task_id=None, key=where or None,
                                  kind="rejected_entry", message=reason)
    hash_key, _, field = where.partition(" m:")
    if hash_key and field:
        try:
            LEAVE_LINE.run(redis_client(app), [companion_key(hash_key, "s")], [field])
        except Exception as drop_error:  # it lapses with its ticket's time
            logger.warning("celery-redislock: could not take %s out of its line: %r",
                           where, drop_error)


def wake_waiters(app: Any, semaphore_key: str, lease: float = RESERVATION) -> int:
    """Hand the free slots of ``semaphore_key`` to its oldest waiters now, re-publishing
    their messages; returns how many were woken. For after an operator raised a limit or
    ended a pause::

        set_slots(app, "crawl", 5)
        wake_waiters(app, semaphore_key("crawl", prefix))
    """
    client = redis_client(app, read_settings(app))
    messages = WAKE.run(client, [semaphore_key], [reservation_ms(lease)])
    return publish(app, messages)
