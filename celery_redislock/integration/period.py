"""At most one run per key per period (``lock_period``), on the Redis server's clock.

A run about to start (admitted by its slots and rates, if any) marks its key for the
period with one atomic ``SET NX PX`` (``engine/lua/owned.lua``, key mark ``p``). A run of
another task id that finds the mark is dropped — its state ``IGNORED``, with a result
naming the run that holds the period — or, with ``lock_period_mode="defer"``, sent back
to the queue (same task id) to come back when the period ends. The same task id may run
again within its own period (its ``self.retry()``, a redelivered message)::

    @app.task(base=LimitedTask, lock_period="10m", lock_key="digest:{user_id}")
    def send_digest(user_id): ...      # at most once per 10 minutes per user
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from celery import states
from celery.exceptions import Ignore
from redis.exceptions import RedisError

from ..config.settings import redis_client
from ..config.unique import PeriodRule
from ..engine.keys import period_key
from ..engine.owned import OwnedLease
from ..errors import LockStoreUnavailable
from ..line.waiting import visibility_ceiling
from ..run.limited import task_settings

logger = logging.getLogger(__name__)

#: How long a deferred run waits beyond the end of the period (s): the broker's delay.
DEFER_MARGIN = 0.05


class Deferred(Ignore):
    """This run was sent back to the queue, ``countdown`` seconds, until its period ends."""

    def __init__(self, countdown: float = 0.0) -> None:
        super().__init__(countdown)  # picklable: the pool sends it to the worker's process
        self.countdown = countdown


def check_period(task: Any, rule: PeriodRule, args: Sequence[Any],
                 kwargs: Mapping[str, Any], request: Any) -> None:
    """Let the run go on if no other run of its key started within the period; else drop
    it (``IGNORED``) or send it back to the queue until the period ends (``defer``)."""
    settings = task_settings(task)
    name = rule.key.render(args, kwargs)
    mark = OwnedLease(redis_client(task._get_app(), settings), period_key(name, settings.prefix),
                      name, request.id or "", rule.period)
    try:
        found = mark.once()
    except RedisError as exc:
        if request.is_eager and not settings.fail_open:
            raise LockStoreUnavailable(
                f"Task {task.name!r}: the lock store is unreachable: {exc}") from exc
        if settings.fail_open:
            logger.warning("celery-redislock: task %s[%s] runs without checking its period "
                           "of %r (%r)", task.name, request.id, name, exc)
            return
        _send_back(task, request, args, kwargs, 1.0)
        raise Deferred(1.0) from exc
    if found is None:
        return
    other, left = found
    if rule.mode == "defer" and not request.is_eager:
        countdown = left + DEFER_MARGIN
        ceiling = visibility_ceiling(task)
        if ceiling is not None:
            countdown = min(countdown, ceiling)  # a longer ETA would be redelivered
        _send_back(task, request, args, kwargs, countdown)
        logger.info("celery-redislock: task %s[%s] deferred %.2f s: %s ran %r within its "
                    "lock_period of %s%s", task.name, request.id, countdown, other, name,
                    _seconds(rule.period), _why_sooner(countdown, left))
        raise Deferred(countdown)
    logger.info("celery-redislock: task %s[%s] dropped: %s ran %r within its period (%.2f s "
                "left)", task.name, request.id, other, name, left)
    if not request.is_eager and not task.ignore_result:
        task.backend.store_result(
            request.id, {"dropped": name, "ran": other, "period_left": left},
            states.IGNORED, request=request)
    raise Ignore()


def _seconds(value: float) -> str:
    """``3600`` -> ``'3600 s'``, ``0.5`` -> ``'0.5 s'``."""
    return f"{value:.3f}".rstrip("0").rstrip(".") + " s"


def _why_sooner(countdown: float, left: float) -> str:
    """What the log says when the run comes back before its period ends: the countdown
    was capped (half the broker's ``visibility_timeout``: a longer ETA is redelivered,
    so run twice), and the run is deferred again then."""
    if countdown >= left:
        return ", until it ends"
    return (f", {_seconds(round(left, 2))} left: back in {countdown:.2f} s, the longest "
            "countdown (half the broker's visibility_timeout, as a longer one is "
            "delivered twice), then deferred again until the period ends")


def _send_back(task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
               countdown: float) -> None:
    task.signature_from_request(request, args, kwargs, countdown=countdown,
                                retries=request.retries).apply_async()
