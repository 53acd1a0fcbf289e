"""What a task does when it finds no free slot: it goes back to the queue for later.

The task is re-published with a countdown, as :meth:`celery.Task.retry` would, but with
``retries`` unchanged, so waiting for a slot uses none of the task's ``max_retries`` budget
and does not show in ``self.request.retries``. The run that found the semaphore full then
ends with :class:`celery.exceptions.Ignore`: no result is stored and no callback runs;
the re-published copy, which has the same task id, carries on.

How long it has waited so far travels with the message in the ``redislock_wait`` header,
measured on the Redis server's clock.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, NoReturn, Optional, Sequence

from celery.exceptions import Ignore

from .backoff import RetryPolicy
from .errors import LockWaitTimeout
from .semaphore import Busy

logger = logging.getLogger(__name__)

WAIT_HEADER = "redislock_wait"

#: Countdowns stay below this share of the broker's ``visibility_timeout``, since a longer
#: ETA is redelivered (so run twice) by the Redis and SQS transports.
VISIBILITY_SHARE = 0.5

#: What kombu's Redis and SQS transports use when ``visibility_timeout`` is not set.
DEFAULT_VISIBILITY_TIMEOUT = 3600

PUBLISH_ATTEMPTS = 3


def wait_state(request: Any) -> Mapping[str, Any]:
    """The ``redislock_wait`` header of a request: ``{"since": ms, "attempts": n}``, or {}."""
    headers = getattr(request, "headers", None) or {}
    state = headers.get(WAIT_HEADER)
    return state if isinstance(state, dict) else {}


def requeue_for_slot(
    task: Any,
    request: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    policy: RetryPolicy,
    busy: Optional[Busy],
    reason: str,
) -> NoReturn:
    """Re-publish the current run of ``task`` with a countdown, then end it (``Ignore``).

    ``busy`` is what the semaphore said, or None when the lock store could not be reached.
    Raises :class:`LockWaitTimeout` instead when the task has waited ``policy.max_wait``.
    """
    state = wait_state(request)
    attempts = int(state.get("attempts", 0))
    since = state.get("since")
    if since is None and busy is not None:
        since = busy.server_time_ms
    waited = (busy.server_time_ms - since) / 1000.0 if busy is not None and since else 0.0

    ceiling = _visibility_ceiling(task)
    if policy.max_wait is not None:
        left = policy.max_wait - waited
        if left <= 0:
            raise LockWaitTimeout(
                f"Task {task.name!r}[{request.id}] waited {waited:.1f} s for a slot of "
                f"{busy.name if busy else '?'!r}, more than its lock_max_wait of "
                f"{policy.max_wait} s"
            )
        ceiling = left if ceiling is None else min(ceiling, left)
    countdown = policy.countdown(attempts, busy, ceiling)

    headers = dict(getattr(request, "headers", None) or {})
    headers[WAIT_HEADER] = {"since": since, "attempts": attempts + 1}
    signature = task.signature_from_request(
        request, args, kwargs, countdown=countdown, headers=headers, retries=request.retries,
    )
    _publish(signature)
    logger.info(
        "celery-redislock: task %s[%s] %s; waiting %.2f s (attempt %d)",
        task.name, request.id, reason, countdown, attempts + 1,
    )
    raise Ignore()


def _publish(signature: Any) -> None:
    for attempt in range(PUBLISH_ATTEMPTS):
        try:
            signature.apply_async()
            return
        except Exception:
            if attempt == PUBLISH_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * 2 ** attempt)


def _visibility_ceiling(task: Any) -> Optional[float]:
    options = task.app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT)
    if isinstance(timeout, (int, float)) and timeout > 0:
        return timeout * VISIBILITY_SHARE
    return None
