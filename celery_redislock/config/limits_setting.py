"""The ``redislock_limits`` setting: limits for tasks by name or glob, with no code change.

    app.conf.redislock_limits = {
        "proj.tasks.send_email":  {"slots": 5},
        "proj.tasks.call_api":    {"rate": "100/m", "key": "token:{api_token}"},
        "proj.tasks.report_*":    {"slots": 1},
        "proj.tasks.charge": [{"slots": 2, "key": "merchant:{merchant_id}"}, {"rate": "50/s"}],
    }

Which entry applies to a task: the entry named exactly after it; else, among the globs
(``fnmatch`` patterns with ``*``, ``?`` or ``[``) that match its name, the longest
pattern, the first one written on a tie. One entry applies; it may hold several limits.
"""

from __future__ import annotations

import difflib
from fnmatch import fnmatchcase
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import LockConfigurationError
from .limit import TaskLimits
from .settings import read_settings

SETTING = "redislock_limits"


def limits_setting(app: Any) -> Mapping[str, Any]:
    """The ``redislock_limits`` mapping of ``app`` (also read as ``CELERY_REDISLOCK_LIMITS``)."""
    setting = app.conf.get(SETTING) or {}
    if not isinstance(setting, Mapping):
        raise LockConfigurationError(
            f"setting {SETTING} must map task names or globs to limits, "
            f"not {type(setting).__name__}"
        )
    for pattern in setting:
        if not isinstance(pattern, str) or not pattern:
            raise LockConfigurationError(
                f"setting {SETTING}: every key must be a task name or glob, not {pattern!r}"
            )
    return setting


def is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def matching_entry(setting: Mapping[str, Any], task_name: str) -> Optional[Tuple[str, Any]]:
    """``(pattern, entry)`` of the entry that applies to ``task_name``, or None."""
    if task_name in setting:
        return task_name, setting[task_name]
    best: Optional[str] = None
    for pattern in setting:
        matches = is_glob(pattern) and fnmatchcase(task_name, pattern)
        if matches and (best is None or len(pattern) > len(best)):
            best = pattern
    return None if best is None else (best, setting[best])


def entry_limits(pattern: str, entry: Any) -> List[Mapping[str, Any]]:
    """The limits of one entry as a list: one dict, or a non-empty list of dicts."""
    if isinstance(entry, Mapping):
        return [entry]
    if isinstance(entry, (list, tuple)) and entry:
        return list(entry)
    raise LockConfigurationError(
        f"setting {SETTING}[{pattern!r}] must be a limit such as {{'slots': 2}} or a "
        f"non-empty list of them, not {entry!r}"
    )


def config_limits(
    app: Any,
    task_name: str,
    func: Callable[..., Any],
    retry_defaults: Optional[Mapping[str, Any]] = None,
) -> Optional[TaskLimits]:
    """The limits ``redislock_limits`` gives ``task_name``, checked; None if no entry applies."""
    found = matching_entry(limits_setting(app), task_name)
    if found is None:
        return None
    pattern, entry = found
    return TaskLimits.compile(
        task_name, func, entry_limits(pattern, entry),
        retry_defaults=retry_defaults, source=f"{SETTING}[{pattern!r}]",
    )


def task_function(task: Any) -> Callable[..., Any]:
    """The function a task runs (before Celery's autoretry wrapper, if any)."""
    return getattr(task, "_orig_run", None) or task.run


def limits_problems(app: Any, tasks: Mapping[str, Any]) -> List[str]:
    """Every problem of the ``redislock_limits`` setting against the registered ``tasks``."""
    try:
        setting = limits_setting(app)
    except LockConfigurationError as exc:
        return [str(exc)]
    problems: List[str] = []
    used: Dict[str, bool] = dict.fromkeys(setting, False)
    for name, task in tasks.items():
        found = matching_entry(setting, name)
        if found is None:
            continue
        used[found[0]] = True
        try:
            config_limits(app, name, task_function(task))
        except LockConfigurationError as exc:
            problems.extend(exc.problems)
    own_tasks = [name for name in tasks if not name.startswith("celery.")]
    for pattern, was_used in used.items():
        if not was_used:
            problems.append(_unused(pattern, own_tasks))
    return problems


def _unused(pattern: str, names: Sequence[str]) -> str:
    message = f"setting {SETTING}[{pattern!r}] matches no registered task"
    close = difflib.get_close_matches(pattern, names, n=3)
    return message + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")


def configuration_problems(app: Any) -> List[str]:
    """Every problem of ``app``'s ``redislock_*`` settings, one sentence each (none: ``[]``).

    What :func:`check_limits` raises, as a list: a worker prints one line per problem.
    """
    problems: List[str] = []
    try:
        read_settings(app)
    except LockConfigurationError as exc:
        problems.extend(exc.problems)
    try:
        tasks = app.tasks  # finalizes the app: lazily defined tasks are checked here
    except LockConfigurationError as exc:
        return [*problems, *exc.problems]
    problems.extend(definition_problems(tasks))
    problems.extend(limits_problems(app, tasks))
    return problems


def definition_problems(tasks: Mapping[str, Any]) -> List[str]:
    """The problems of every task's own limit options (a ``LimitedTask``'s
    ``definition_problems()``: a misspelt option, a key naming an argument the task
    lacks, a bad rate, ...)."""
    problems: List[str] = []
    for task in tasks.values():
        problems_of = getattr(task, "definition_problems", None)
        if callable(problems_of):
            problems.extend(problems_of())
    return problems


def check_limits(app: Any) -> None:
    """Check every ``redislock_*`` setting against ``app``'s registered tasks.

    Raises :class:`LockConfigurationError` listing every problem, all at once (its
    ``problems`` holds them one by one), of the setting and of every ``LimitedTask``'s
    options: an unknown field or option (with the closest known one), a bad rate, a
    number out of its range, a ``key`` naming an argument the task does not take or with
    a bad conversion or format spec, an entry that matches no task. Workers run it at
    start (one line per problem); call it from a deploy check too::

        from celery_redislock import check_limits
        check_limits(app)
    """
    problems = configuration_problems(app)
    if problems:
        raise LockConfigurationError(
            "celery-redislock configuration has problems:\n  - " + "\n  - ".join(problems),
            problems,
        )
