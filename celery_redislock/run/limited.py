"""Which tasks the package limits, their limits and leases, and the worker this process
belongs to: what both processes and the operators' tools ask of a task.

Example::

    >>> from celery_redislock import LimitedTask
    >>> from celery_redislock.run.limited import is_limited
    >>> is_limited(LimitedTask()), is_limited(object())
    (True, False)
"""

from __future__ import annotations

from typing import Any, Optional

from ..config.limit import TaskLimits
from ..config.settings import Settings, read_settings
from ..errors import LockConfigurationError

#: The node name (``name``) and start id (``start``) of the worker whose main process
#: this is (or whose pool child: they are inherited through ``fork``), once it started.
this_worker: dict = {}


def this_start(worker: Optional[str]) -> str:
    """The start id of this process's worker if it is node ``worker``, else ``""``."""
    if worker and worker == this_worker.get("name"):
        return str(this_worker.get("start") or "")
    return ""


def is_limited(task: Any) -> bool:
    """Whether the package limits ``task``: a ``LimitedTask``, or a plain task that
    ``redislock_limits`` names (both mark their class ``_redislock_limited``)."""
    return bool(getattr(type(task), "_redislock_limited", False))


def limits_of(task: Any) -> Optional[TaskLimits]:
    """The limits a task runs under, or None if the package does not limit it."""
    return task.task_limits() if is_limited(task) else None


def longest_lease(app: Any, default: float = 30.0) -> float:
    """The longest lease (s) of the limited tasks of ``app`` (``default`` if it has
    none), or ``redislock_max_lease`` if longer: what its processes declare as the
    grace after a loss of the lock store's data."""
    leases = [lease for lease in map(_lease_of, list(app.tasks.values())) if lease]
    return max(max(leases, default=default), read_settings(app).max_lease or 0.0)


def _lease_of(task: Any) -> Optional[float]:
    """The lease of ``task``'s limits; None if it has none, or they are wrong (that is
    reported where it runs, not to every other task)."""
    try:
        limits = limits_of(task)
    except LockConfigurationError:
        return None
    return limits.lease if limits else None


def uses_limits(app: Any) -> bool:
    """True if any task of ``app`` is a ``LimitedTask`` or limited by ``redislock_limits``."""
    return any(is_limited(task) for task in app.tasks.values())


def task_settings(task: Any) -> Settings:
    """The package settings of ``task``'s app, read once per task object."""
    settings = getattr(task, "_redislock_settings", None)
    if settings is None:
        settings = read_settings(task._get_app())
        task._redislock_settings = settings
    return settings
