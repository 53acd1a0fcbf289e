"""Task-wide options about whole runs rather than slots: unique at enqueue, once per period.

``unique`` / ``lock_unique``            ``True`` (a second send returns the queued task's
                                        result) or ``"raise"`` (it raises ``AlreadyQueued``)
``unique_lease`` / ``lock_unique_lease`` seconds the unique lock lasts while the task is
                                        queued (its countdown is added); default 600
``period`` / ``lock_period``            at most one run per key per period: ``"10m"``,
                                        ``"30s"``, ``"2h"``, ``"1d"`` or seconds
``period_mode`` / ``lock_period_mode``  ``"drop"`` (default: later runs within the period
                                        end IGNORED) or ``"defer"`` (they come back when
                                        the period ends)

Both use the key of the limit they are given with (``lock_key``, or the entry's ``key``),
each under a Redis key of its own (marks ``u`` and ``p``, see
:mod:`celery_redislock.engine.keys`)::

    rules = once_rules("Task 'proj.report'", "proj.report", report,
                       [{"unique": True, "key": "account:{account_id}"}], prefix="")
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ..engine.bounds import in_range, shown, span
from ..engine.keys import KeyTemplate
from ..errors import LockConfigurationError

#: The task-wide fields, and their defaults.
ONCE_FIELDS: Mapping[str, Any] = {
    "unique": None,
    "unique_lease": 600.0,
    "period": None,
    "period_mode": "drop",
}

UNIQUE_MODES = {True: "return", "return": "return", "raise": "raise"}
PERIOD_MODES = ("drop", "defer")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The longest unique lease and period: 30 days.
MAX_DURATION = 30 * 86400.0
#: The shortest unique lease (s) and period (s).
MIN_UNIQUE_LEASE, MIN_PERIOD = 1.0, 0.001

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


@dataclass(frozen=True)
class UniqueRule:
    """At most one queued-or-running task per name built by ``key``."""

    key: KeyTemplate
    #: ``"return"``: a second send returns the first's result; ``"raise"``: AlreadyQueued.
    mode: str
    #: Seconds the lock lasts while the task waits in the queue (plus its countdown).
    queue_lease: float


@dataclass(frozen=True)
class PeriodRule:
    """At most one run per name built by ``key`` per ``period`` seconds."""

    key: KeyTemplate
    period: float
    #: ``"drop"`` or ``"defer"``.
    mode: str


def parse_duration(value: Any, owner: str, option: str, low: float = MIN_PERIOD,
                   high: float = MAX_DURATION) -> float:
    """Seconds from ``"10m"``, ``"30s"``, ``"500ms"``, ``"2h"``, ``"1d"`` or a number, from
    ``low`` to ``high``.

        >>> parse_duration("10m", "Task 'x'", "lock_period")
        600.0
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = value
    else:
        found = _DURATION.match(value) if isinstance(value, str) else None
        if found is None:
            raise LockConfigurationError(
                f"{owner}: {option} must be a duration such as '10m', '30s', '2h' or a "
                f"number of seconds, not {shown(value)}")
        seconds = float(found.group(1)) * _UNITS[found.group(2) or "s"]
    if not in_range(seconds, low, high):
        raise LockConfigurationError(
            f"{owner}: {option} must be a duration {span(low, high)} s, not {shown(value)}")
    return float(seconds)


def once_rules(owner: str, task_name: str, func: Callable[..., Any],
               entries: Sequence[Mapping[str, Any]],
               prefix: str) -> Tuple[Optional[UniqueRule], Optional[PeriodRule]]:
    """The unique and period rules of limit ``entries`` (each field given at most once,
    with the ``key`` of the entry that gives it)."""
    given: Dict[str, Tuple[Any, Mapping[str, Any]]] = {}
    for entry in entries:
        for name in ONCE_FIELDS:
            if entry.get(name) not in (None, ONCE_FIELDS[name]):
                if name in given and given[name][0] != entry[name]:
                    raise LockConfigurationError(
                        f"{owner}: {prefix}{name} is given twice, as {given[name][0]!r} "
                        f"and {entry[name]!r}")
                given[name] = (entry[name], entry)
    unique = _unique(owner, task_name, func, given, prefix)
    period = _period(owner, task_name, func, given, prefix)
    return unique, period


def _value(given: Mapping[str, Tuple[Any, Any]], name: str) -> Any:
    return given[name][0] if name in given else ONCE_FIELDS[name]


def _unique(owner: str, task_name: str, func: Callable[..., Any],
            given: Mapping[str, Tuple[Any, Mapping[str, Any]]],
            prefix: str) -> Optional[UniqueRule]:
    value = _value(given, "unique")
    if value in (None, False):
        if "unique_lease" in given:
            raise LockConfigurationError(
                f"{owner}: '{prefix}unique_lease' is given without '{prefix}unique'")
        return None
    if not isinstance(value, (bool, str)) or value not in UNIQUE_MODES:
        raise LockConfigurationError(
            f"{owner}: {prefix}unique must be True or 'raise', not {value!r}")
    lease = parse_duration(_value(given, "unique_lease"), owner, f"{prefix}unique_lease",
                           MIN_UNIQUE_LEASE)
    key = KeyTemplate(given["unique"][1].get("key"), func, owner=owner, default=task_name,
                      option=f"{prefix}key")
    return UniqueRule(key=key, mode=UNIQUE_MODES[value], queue_lease=lease)


def _period(owner: str, task_name: str, func: Callable[..., Any],
            given: Mapping[str, Tuple[Any, Mapping[str, Any]]],
            prefix: str) -> Optional[PeriodRule]:
    value = _value(given, "period")
    mode = _value(given, "period_mode")
    if value is None:
        if "period_mode" in given:
            raise LockConfigurationError(
                f"{owner}: '{prefix}period_mode' is given without '{prefix}period'")
        return None
    if mode not in PERIOD_MODES:
        raise LockConfigurationError(
            f"{owner}: {prefix}period_mode must be 'drop' or 'defer', not {mode!r}")
    key = KeyTemplate(given["period"][1].get("key"), func, owner=owner, default=task_name,
                      option=f"{prefix}key")
    return PeriodRule(key=key, period=parse_duration(value, owner, f"{prefix}period"),
                      mode=mode)
