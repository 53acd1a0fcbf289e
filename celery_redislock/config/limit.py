"""A task's limits — slots and rates over keys built from its arguments — checked once.

The same fields describe a limit whether they come from a task's options (``lock_slots``,
``lock_rate``, ...) or from an entry of the ``redislock_limits`` setting (``slots``,
``rate``, ...): the option names are the field names with ``lock_`` in front.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from ..engine.admission import Limiter, RateLimit, SlotLimit
from ..engine.bounds import in_range, shown, span
from ..engine.keys import KeyTemplate, semaphore_key
from ..engine.rate import Rate
from ..engine.semaphore import DEFAULT_LEASE, check_lease, check_slots
from ..errors import LockConfigurationError
from .cost import CallableCost, Cost, check_cost
from .retry import MIN_COUNTDOWN, RetryPolicy
from .unique import ONCE_FIELDS, PeriodRule, UniqueRule, once_rules

#: Fields of one limit, and their defaults.
LIMIT_FIELDS: Mapping[str, Any] = {
    "slots": None,
    "rate": None,
    "burst": 1,
    "key": None,
    "lease": DEFAULT_LEASE,
    "cost": 1,
    "fair_by": None,
}

#: Fields about waiting, which apply to the task as a whole, and their defaults.
RETRY_FIELDS: Mapping[str, Any] = {
    "retry_backoff": 1.0,
    "retry_backoff_max": 30.0,
    "retry_jitter": True,
    "max_wait": None,
    "priority": None,
    "priority_aging": 10.0,
}

#: The task options of :class:`~celery_redislock.LimitedTask`, with their defaults.
OPTION_DEFAULTS: Mapping[str, Any] = {
    f"lock_{name}": default
    for name, default in {**LIMIT_FIELDS, **RETRY_FIELDS, **ONCE_FIELDS}.items()
}


@dataclass(frozen=True)
class LimitRule:
    """One limit: at most ``slots`` at once and/or ``rate``, per name built by ``key``."""

    key: KeyTemplate
    slots: Optional[int]
    rate: Optional[Rate]
    lease: float
    #: Slots one run takes and starts of the rate it uses, at once (``lock_cost``): a
    #: number, or a callable of the task's arguments.
    cost: Cost = 1
    #: False when ``slots`` is the default a ``LimitedTask`` gets without ``lock_slots``
    #: nor ``lock_rate`` (one run at a time per key), for messages that say so.
    slots_given: bool = True
    #: The line of this limit's slots is served round-robin across the keys this
    #: template gives the run (``fair_by``, e.g. ``"tenant:{tenant}"``), or None: first
    #: come first served.
    fair_by: Optional[KeyTemplate] = None

    def limiters(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                 prefix: str) -> List[Limiter]:
        """The limiters of this rule for one call (its cost worked out, if a callable:
        :class:`~celery_redislock.errors.LockCostError` if it cannot be)."""
        name = self.key.render(args, kwargs)
        cost = self.cost(args, kwargs) if isinstance(self.cost, CallableCost) else self.cost
        limiters: List[Limiter] = []
        if self.slots is not None:
            fair = self.fair_by.render(args, kwargs) if self.fair_by is not None else ""
            limiters.append(SlotLimit(name, self.slots, prefix, cost, fair))
        if self.rate is not None:
            limiters.append(RateLimit(name, self.rate, prefix, cost))
        return limiters

    @property
    def is_constant(self) -> bool:
        """True when every call gets the same limiters (a fixed name and cost)."""
        return (self.key.is_constant and not isinstance(self.cost, CallableCost)
                and (self.fair_by is None or self.fair_by.is_constant))


@dataclass(frozen=True)
class TaskLimits:
    """Every limit on one task, and how its runs wait for them.

    Example::

        limits = TaskLimits.compile(
            "proj.tasks.charge", charge,
            [{"slots": 2, "key": "merchant:{merchant_id}"}, {"rate": "50/s"}],
        )
        limits.limiters((7, 100), {}, prefix="redislock:")
        # [SlotLimit('merchant:7', 2, ...), RateLimit('proj.tasks.charge', 50/1s, ...)]
    """

    owner: str
    rules: Tuple[LimitRule, ...]
    retry: RetryPolicy
    source: str
    #: At most one queued-or-running task per key (``lock_unique``), if set.
    unique: Optional[UniqueRule] = None
    #: At most one run per key per period (``lock_period``), if set.
    period: Optional[PeriodRule] = None
    _constant: Dict[str, List[Limiter]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def lease(self) -> float:
        """The lease of the run's slots: the shortest any of its limits asks for."""
        leases = [rule.lease for rule in self.rules if rule.slots is not None]
        return min(leases) if leases else DEFAULT_LEASE

    def limiters(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                 prefix: str) -> List[Limiter]:
        """The limiters one call with these arguments must pass."""
        constant = self._constant.get(prefix)
        if constant is not None:
            return constant
        limiters = [
            limiter for rule in self.rules for limiter in rule.limiters(args, kwargs, prefix)
        ]
        if all(rule.is_constant for rule in self.rules):
            self._constant[prefix] = limiters
        return limiters

    def slot_keys(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                  prefix: str) -> List[str]:
        """The semaphore keys of one call, without working out its cost (for cleaning up
        after a run, which needs only where its slots are)."""
        return [semaphore_key(rule.key.render(args, kwargs), prefix)
                for rule in self.rules if rule.slots is not None]

    @classmethod
    def compile(
        cls,
        task_name: str,
        func: Callable[..., Any],
        entries: Sequence[Mapping[str, Any]],
        *,
        retry_defaults: Optional[Mapping[str, Any]] = None,
        source: str = "task options",
        default_slots: Optional[int] = None,
        option_prefix: str = "",
    ) -> TaskLimits:
        """Check limit entries (dicts of :data:`LIMIT_FIELDS` and :data:`RETRY_FIELDS`).

        ``default_slots`` is used by an entry that gives neither ``slots`` nor ``rate``;
        ``option_prefix`` (``"lock_"`` for task options) is put before field names in errors.
        Raises :class:`LockConfigurationError` naming the task, the source and the problem.
        """
        owner = f"Task {task_name!r}" + ("" if source == "task options" else f" ({source})")
        if not entries:
            raise LockConfigurationError(f"{owner}: no limit given")
        problems: List[str] = []
        retry_values: Dict[str, Any] = {**RETRY_FIELDS, **(retry_defaults or {})}
        retry_set: Dict[str, Any] = {}
        rules = []
        for entry in entries:
            if not isinstance(entry, Mapping):
                problems.append(
                    f"{owner}: a limit must be a dict such as {{'slots': 2}}, not {entry!r}")
                continue
            problems.extend(_unknown_fields(owner, entry, option_prefix))
            problems.extend(_take_retry_fields(owner, entry, retry_set, option_prefix))
            if _limits_runs(entry, default_slots):
                rules.append(_rule(problems, owner, task_name, func, entry, default_slots,
                                   option_prefix))
        retry_values.update(retry_set)
        retry = _retry_policy(problems, owner, retry_values, option_prefix)
        valid = [entry for entry in entries if isinstance(entry, Mapping)]
        once = _checked(problems, once_rules, owner, task_name, func, valid, option_prefix)
        if problems or retry is None or once is None:
            raise LockConfigurationError.listing(owner, problems)
        return cls(owner=owner, rules=tuple(rule for rule in rules if rule is not None),
                   retry=retry, source=source, unique=once[0], period=once[1])


def _limits_runs(entry: Mapping[str, Any], default_slots: Optional[int]) -> bool:
    """False for a ``redislock_limits`` entry that only makes a task unique or once per
    period (``{"unique": True}``): it limits no slots nor rate."""
    if default_slots is not None or entry.get("slots") is not None \
            or entry.get("rate") is not None:
        return True
    return not any(entry.get(name) is not None for name in ("unique", "period"))


#: The longest countdown: beyond a Redis broker's default ``visibility_timeout`` (one
#: hour) a message with a countdown is delivered twice.
MAX_COUNTDOWN = 3600.0

#: The range of ``priority`` (higher first, as AMQP orders messages).
MIN_PRIORITY, MAX_PRIORITY = 0, 255

#: The longest ``max_wait``: 30 days.
MAX_WAIT = 30 * 86400.0

_T = TypeVar("_T")


def _checked(problems: List[str], check: Callable[..., _T], *args: Any,
             **kwargs: Any) -> Optional[_T]:
    """``check(*args, **kwargs)``, or None with its problems added to ``problems``."""
    try:
        return check(*args, **kwargs)
    except LockConfigurationError as exc:
        problems.extend(exc.problems)
        return None


def _unknown_fields(owner: str, entry: Mapping[str, Any], prefix: str) -> List[str]:
    """A problem per unknown field of ``entry``, with the closest known one as a hint."""
    known = [*LIMIT_FIELDS, *RETRY_FIELDS, *ONCE_FIELDS]
    word = "option" if prefix else "field"
    problems = []
    for name in sorted((name for name in entry if name not in known), key=repr):
        if not isinstance(name, str):
            problems.append(f"{owner}: {word} {name!r} is not a name")
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = (f"did you mean {prefix}{close[0]}?" if close
                else "known: " + ", ".join(prefix + field for field in known))
        problems.append(f"{owner}: unknown {word} {prefix}{name} ({hint})")
    return problems


def _take_retry_fields(owner: str, entry: Mapping[str, Any], retry_set: Dict[str, Any],
                       prefix: str) -> List[str]:
    """Add ``entry``'s waiting fields to ``retry_set``; a problem per one given twice."""
    problems = []
    for name in RETRY_FIELDS:
        if name in entry:
            if name in retry_set and retry_set[name] != entry[name]:
                problems.append(f"{owner}: {prefix}{name} is given twice, as "
                                f"{retry_set[name]!r} and {entry[name]!r}")
                continue
            retry_set[name] = entry[name]
    return problems


def _rule(problems: List[str], owner: str, task_name: str, func: Callable[..., Any],
          entry: Mapping[str, Any], default_slots: Optional[int],
          prefix: str) -> Optional[LimitRule]:
    """One limit, or None with what is wrong with it added to ``problems``."""
    before = len(problems)
    values = {**LIMIT_FIELDS, **entry}
    slots, rate = values["slots"], values["rate"]
    slots_given = slots is not None
    if slots is None and rate is None:
        if default_slots is None:
            problems.append(f"{owner}: a limit needs '{prefix}slots', '{prefix}rate' or both")
        slots = default_slots
    if rate is None and values["burst"] != LIMIT_FIELDS["burst"]:
        problems.append(f"{owner}: '{prefix}burst' is given without a '{prefix}rate'")
    key = _checked(problems, KeyTemplate, values["key"], func, owner=owner, default=task_name,
                   option=f"{prefix}key")
    if slots is not None:
        slots = _checked(problems, check_slots, slots, owner, f"{prefix}slots")
    if rate is not None:
        rate = _checked(problems, Rate.parse, rate, values["burst"], owner=owner, prefix=prefix)
    lease = _checked(problems, check_lease, values["lease"], owner, f"{prefix}lease")
    fair_by = _fair_by(problems, owner, func, values["fair_by"], slots, prefix)
    if len(problems) > before or key is None or lease is None:
        return None
    cost = _checked(problems, check_cost, owner, values["cost"], slots=slots, rate=rate,
                    prefix=prefix, func=func)
    if cost is None:
        return None
    return LimitRule(key=key, slots=slots, rate=rate, lease=lease, cost=cost,
                     slots_given=slots_given, fair_by=fair_by)


def _fair_by(problems: List[str], owner: str, func: Callable[..., Any], value: Any,
             slots: Optional[int], prefix: str) -> Optional[KeyTemplate]:
    """The ``fair_by`` template of a limit (None for none), checked as a ``key`` is: a
    template of the task's arguments; only on a limit of slots."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.append(f"{owner}: {prefix}fair_by must be a key template such as "
                        f"'tenant:{{tenant}}', not {shown(value)}")
        return None
    if slots is None:
        problems.append(f"{owner}: '{prefix}fair_by' is given without '{prefix}slots' (a "
                        f"fair share divides slots)")
        return None
    return _checked(problems, KeyTemplate, value, func, owner=owner, default=value,
                    option=f"{prefix}fair_by")


def _retry_policy(problems: List[str], owner: str, values: Mapping[str, Any],
                  prefix: str) -> Optional[RetryPolicy]:
    """How the task waits, or None with what is wrong added to ``problems``."""
    before = len(problems)
    jitter = values["retry_jitter"]
    if not isinstance(jitter, bool):
        problems.append(f"{owner}: {prefix}retry_jitter must be True or False, not {jitter!r}")
    backoff = _seconds(problems, values["retry_backoff"], owner, f"{prefix}retry_backoff",
                       0.0, MAX_COUNTDOWN)
    backoff_max = _seconds(problems, values["retry_backoff_max"], owner,
                           f"{prefix}retry_backoff_max", MIN_COUNTDOWN, MAX_COUNTDOWN)
    max_wait = values["max_wait"]
    if max_wait is not None:
        max_wait = _seconds(problems, max_wait, owner, f"{prefix}max_wait", 0.0, MAX_WAIT,
                            ", or None")
    priority = values["priority"]
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        problems.append(f"{owner}: {prefix}priority must be a whole number from "
                        f"{MIN_PRIORITY} to {MAX_PRIORITY}, or None, not {shown(priority)}")
    aging = _seconds(problems, values["priority_aging"], owner, f"{prefix}priority_aging",
                     0.001, MAX_COUNTDOWN)
    if len(problems) > before:
        return None
    return RetryPolicy(backoff=backoff, backoff_max=backoff_max, jitter=jitter,
                       max_wait=max_wait, priority=priority, priority_aging=aging)


def _seconds(problems: List[str], value: Any, owner: str, option: str, low: float,
             high: float, alternative: str = "") -> float:
    if not in_range(value, low, high):
        problems.append(f"{owner}: {option} must be a number of seconds, {span(low, high)}"
                        f"{alternative}, not {shown(value)}")
        return 0.0
    return float(value)
