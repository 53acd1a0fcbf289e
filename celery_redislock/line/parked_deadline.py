"""A parked run's ``lock_max_wait`` (``redislock_line = "broker"``): a run parked longer
than its max wait is moved out of its parking queue by the poll (a deadline move, see
``engine/lua/deadline.lua``), and its admission in the worker's main process answers
:class:`~..engine.parking.GaveUp` (its reference dropped, nothing held). The main
process cannot fail a task: it hands the run to the pool with the reason in its
request (:data:`GAVE_UP`), and the pool process raises
:class:`~..errors.LockWaitTimeout` before the body, stored as the task's failure, as
today's line gives up.

    >>> GaveUpHere("gave up").message
    'gave up'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..engine.parking import GaveUp
from ..errors import LockWaitTimeout

__all__ = ["GAVE_UP", "GaveUpHere", "fail_if_gave_up", "gave_up"]

#: The request field that carries why a parked run gave up, for the pool process.
GAVE_UP = "redislock_gave_up"


@dataclass(frozen=True)
class GaveUpHere:
    """What the main process's admission answers for a parked run that gave up: the
    pool process fails it with ``message`` (see :meth:`mark`)."""

    message: str

    def mark(self, request: Any) -> None:
        """Put the reason in Celery ``request``'s fields, for the pool process."""
        request.request_dict[GAVE_UP] = self.message


def gave_up(task: Any, request: Any, outcome: GaveUp, max_wait: Optional[float]) -> GaveUpHere:
    """The answer for a run the lock store gave up (``outcome``)."""
    return GaveUpHere(
        f"Task {task.name!r}[{request.id}] waited {outcome.waited:.1f} s parked behind "
        f"{outcome.name!r} and gave up: beyond its max_wait of {max_wait} s")


def fail_if_gave_up(request: Any) -> None:
    """In the pool process, before the body: raise ``LockWaitTimeout`` for a run the
    main process found given up.

        >>> class Request: redislock_gave_up = "waited too long"
        >>> fail_if_gave_up(Request())
        Traceback (most recent call last):
        ...
        celery_redislock.errors.LockWaitTimeout: waited too long
    """
    message = getattr(request, GAVE_UP, None)
    if message:
        raise LockWaitTimeout(message)
