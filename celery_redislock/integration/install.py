"""``install(app)``: apply ``redislock_limits`` to plain tasks and check it at worker start.

Plain ``@app.task`` functions get their ``__call__`` wrapped through Celery's own task
annotations (``task_annotations`` with an ``@__call__`` entry), which is how Celery lets
configuration change how a task runs (and, for an entry with ``unique``, their
``apply_async``, the same way, so that sends are deduplicated); ``LimitedTask`` reads the
setting itself. A worker bootstep runs :func:`~celery_redislock.check_limits` when a
worker starts, after the task modules are imported, and stops the worker with one line per
problem (no traceback) if there are any.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Dict, Mapping, Optional

from ..config.limit import TaskLimits
from ..config.limits_setting import (
    config_limits,
    entry_limits,
    limits_setting,
    matching_entry,
    task_function,
)
from ..gate.recovery import DEFAULT_REQUEST, DEFAULT_STRATEGY, LIMITED_REQUEST, LIMITED_STRATEGY
from ..gate.startup import CheckAtStart
from .unique import run_task, send_unique

logger = logging.getLogger(__name__)


def install(app: Any) -> None:
    """Make ``app`` honour the ``redislock_limits`` setting for every task.

    Example (in the module that creates the app)::

        from celery import Celery
        import celery_redislock

        app = Celery("proj")
        app.conf.redislock_limits = {"proj.tasks.send_email": {"slots": 5}}
        celery_redislock.install(app)

    Calling it twice is harmless.
    """
    if getattr(app, "_redislock_installed", False):
        return
    app._redislock_installed = True
    annotation = LimitsAnnotation(app)
    current = app.conf.task_annotations
    if current is None:
        current = []
    elif isinstance(current, (dict, str)) or not isinstance(current, (list, tuple)):
        current = [current]
    app.conf.task_annotations = [*current, annotation]
    app.__dict__.pop("annotations", None)  # Celery caches the prepared annotations
    app.steps["worker"].add(CheckAtStart)
    if app.finalized:
        for task in list(app._tasks.values()):
            annotation.apply_to(type(task))


class LimitsAnnotation:
    """A Celery task annotation that wraps ``__call__`` of the tasks a limit names."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def annotate(self, task_class: Any) -> Optional[Dict[str, Callable[..., Any]]]:
        if getattr(task_class, "_redislock_limited", False):
            return None
        found = matching_entry(limits_setting(self.app), task_class.name or "")
        if found is None:
            return None
        task_class._redislock_wrapped = True
        task_class._redislock_limited = True
        task_class.task_limits = _limits_of
        annotation: Dict[str, Any] = {"@__call__": _limited_call}
        if _makes_unique(*found):
            annotation["@apply_async"] = _unique_send
        if task_class.Request == DEFAULT_REQUEST:
            annotation["Request"] = LIMITED_REQUEST  # frees a lost child's slots at once
        if task_class.Strategy == DEFAULT_STRATEGY:
            annotation["Strategy"] = LIMITED_STRATEGY  # waits never reach the pool
        return annotation

    def apply_to(self, task_class: Any) -> None:
        """Annotate a task class that Celery bound before :func:`install` was called."""
        for attribute, value in (self.annotate(task_class) or {}).items():
            if attribute.startswith("@"):
                task_class.add_around(attribute[1:], value)
            else:
                setattr(task_class, attribute, value)


def _limited_call(original_call: Callable[..., Any]) -> Callable[..., Any]:
    custom = getattr(original_call, "__qualname__", "").split(".")[0] not in (
        "Task", "_install_stack_protection",
    )

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return original_call(self, *args, **kwargs)
        if custom:
            def body() -> Any:
                return original_call(self, *args, **kwargs)
        else:
            def body() -> Any:
                return self.run(*args, **kwargs)
        return run_task(self, _limits_of(self), args, kwargs, body, request)

    return __call__


def _makes_unique(pattern: str, entry: Any) -> bool:
    try:
        limits = entry_limits(pattern, entry)
    except Exception:
        return False  # check_limits reports it
    return any(isinstance(limit, Mapping) and limit.get("unique") not in (None, False)
               for limit in limits)


def _unique_send(original_send: Callable[..., Any]) -> Callable[..., Any]:
    def apply_async(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        unique = _limits_of(self).unique
        send = functools.partial(original_send, self)
        if unique is None:
            return send(args, kwargs, **options)
        return send_unique(self, unique, send, args, kwargs, options)

    return apply_async


def _limits_of(task: Any) -> TaskLimits:
    limits = task.__dict__.get("_redislock_limits")
    if limits is None:
        limits = config_limits(task._get_app(), task.name, task_function(task))
        task.__dict__["_redislock_limits"] = limits
    return limits

