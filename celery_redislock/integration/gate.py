"""Admission in the worker's main process, before the pool sees a request.

A run that finds no slot must be invisible to Celery's run semantics: no
``task_prerun``/``task_postrun``, no STARTED state, no pool process taken, nothing for
``revoke(terminate=True)`` to miss. So, as Celery's own ``rate_limit`` does in its
consumer (``celery/worker/strategy.py``), limited tasks are given a strategy that asks
their limits in the worker's main process, just before a request goes to the pool:

* admitted: the lease goes to the pool process with the request (the request field
  :data:`~.execution.ADMITTED`); the pool process adopts it (one script: renewed, and
  described with its own process id), keeps it alive while the body runs and releases
  it at the end. A pool process lost before or after that has its slots freed by the
  main process, as before (see :mod:`.recovery`);
* refused: the run is sent back to wait (see :mod:`.waiting`), or ends as served by
  another copy of its message, or follows an earlier run of its task (see
  :func:`~.waiting.follow`), and its message is acknowledged, without ever reaching
  the pool;
* anything else (a rate limit among its limits, the lock store unreachable, the pool
  has no free process for it, a run that gave up waiting) goes to the pool as
  before, where the run decides for itself (:func:`~.execution.run_limited`).

    >>> from celery_redislock import LimitedTask
    >>> LimitedTask.Strategy
    'celery_redislock.integration.gate:limited_strategy'
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from celery.exceptions import Ignore
from celery.worker import state as worker_state
from celery.worker.strategy import default as default_strategy

from .execution import ADMITTED, admit_before_pool
from .recovery import forget_copy, limits_of

logger = logging.getLogger(__name__)


def limited_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Callable[..., Any]:
    """Celery's default strategy for ``task``, with admission before the pool."""
    return default_strategy(task, app, _GatedConsumer(consumer), **options)


class _GatedConsumer:
    """The worker's consumer as Celery's default strategy sees it, with the requests it
    hands to the pool (directly, or after an ETA or countdown) passed through
    :func:`gate` first. Everything else is the consumer's own."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        handle = consumer.on_task_request
        self.on_task_request = lambda request: gate(consumer, request, handle)

    def apply_eta_task(self, request: Any) -> None:
        worker_state.task_reserved(request)
        self.on_task_request(request)
        self._consumer.qos.decrement_eventually()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def gate(consumer: Any, request: Any, handle: Callable[[Any], Any]) -> Any:
    """Hand ``request`` to the pool (``handle``) once its limits admit it, or end it here
    (acknowledged, never run) when they do not."""
    task = request.task
    limits = limits_of(task)
    if limits is None or request.revoked() or not _pool_has_room(consumer):
        return handle(request)
    try:
        handed = admit_before_pool(task, limits, request._context)
    except Ignore:
        forget_copy(request)
        request.acknowledge()
        return None
    except Exception as exc:  # never lose a request: the pool process decides instead
        logger.warning("celery-redislock: task %s[%s]: could not ask its limits before the "
                       "pool (%r); the pool process asks", task.name, request.id, exc)
        handed = None
    if handed is not None:
        request.request_dict[ADMITTED] = handed
    return handle(request)


def _pool_has_room(consumer: Any) -> bool:
    """Whether a pool process is free for one more request: a slot taken here is held
    until a pool process starts the run, so it is taken only when one can start it now."""
    processes = getattr(consumer.pool, "num_processes", None) or 0
    return processes > 0 and len(worker_state.reserved_requests) <= processes
