"""A task's limits — slots and rates over keys built from its arguments — checked once.

The same fields describe a limit whether they come from a task's options (``lock_slots``,
``lock_rate``, ...) or from an entry of the ``redislock_limits`` setting (``slots``,
``rate``, ...): the option names are the field names with ``lock_`` in front.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..engine.admission import Limiter, RateLimit, SlotLimit
from ..engine.keys import KeyTemplate
from ..engine.rate import Rate
from ..engine.semaphore import DEFAULT_LEASE, check_lease, check_slots
from ..errors import LockConfigurationError
from .retry import RetryPolicy

#: Fields of one limit, and their defaults.
LIMIT_FIELDS: Mapping[str, Any] = {
    "slots": None,
    "rate": None,
    "burst": 1,
    "key": None,
    "lease": DEFAULT_LEASE,
}

#: Fields about waiting, which apply to the task as a whole, and their defaults.
RETRY_FIELDS: Mapping[str, Any] = {
    "retry_backoff": 1.0,
    "retry_backoff_max": 30.0,
    "retry_jitter": True,
    "max_wait": None,
}

#: The task options of :class:`~celery_redislock.LimitedTask`, with their defaults.
OPTION_DEFAULTS: Mapping[str, Any] = {
    f"lock_{name}": default for name, default in {**LIMIT_FIELDS, **RETRY_FIELDS}.items()
}


@dataclass(frozen=True)
class LimitRule:
    """One limit: at most ``slots`` at once and/or ``rate``, per name built by ``key``."""

    key: KeyTemplate
    slots: Optional[int]
    rate: Optional[Rate]
    lease: float

    def limiters(self, args: Sequence[Any], kwargs: Mapping[str, Any],
                 prefix: str) -> List[Limiter]:
        name = self.key.render(args, kwargs)
        limiters: List[Limiter] = []
        if self.slots is not None:
            limiters.append(SlotLimit(name, self.slots, prefix))
        if self.rate is not None:
            limiters.append(RateLimit(name, self.rate, prefix))
        return limiters


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
        if all(rule.key.is_constant for rule in self.rules):
            self._constant[prefix] = limiters
        return limiters

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
        retry_values: Dict[str, Any] = dict(RETRY_FIELDS)
        retry_values.update(retry_defaults or {})
        retry_set: Dict[str, Any] = {}
        rules = []
        for entry in entries:
            if not isinstance(entry, Mapping):
                raise LockConfigurationError(
                    f"{owner}: a limit must be a dict such as {{'slots': 2}}, not {entry!r}"
                )
            unknown = set(entry) - set(LIMIT_FIELDS) - set(RETRY_FIELDS)
            if unknown:
                known = ", ".join(option_prefix + name for name in [*LIMIT_FIELDS, *RETRY_FIELDS])
                raise LockConfigurationError(
                    f"{owner}: unknown field(s) {', '.join(sorted(unknown))} "
                    f"(known: {known})"
                )
            for name in RETRY_FIELDS:
                if name in entry:
                    if name in retry_set and retry_set[name] != entry[name]:
                        raise LockConfigurationError(
                            f"{owner}: {option_prefix}{name} is given twice, as "
                            f"{retry_set[name]!r} and {entry[name]!r}"
                        )
                    retry_set[name] = entry[name]
            rules.append(_rule(owner, task_name, func, entry, default_slots, option_prefix))
        retry_values.update(retry_set)
        return cls(owner=owner, rules=tuple(rules),
                   retry=_retry_policy(owner, retry_values, option_prefix), source=source)


def _rule(owner: str, task_name: str, func: Callable[..., Any], entry: Mapping[str, Any],
          default_slots: Optional[int], prefix: str) -> LimitRule:
    values = {**LIMIT_FIELDS, **entry}
    slots, rate = values["slots"], values["rate"]
    if slots is None and rate is None:
        if default_slots is None:
            raise LockConfigurationError(
                f"{owner}: a limit needs '{prefix}slots', '{prefix}rate' or both"
            )
        slots = default_slots
    if rate is None and values["burst"] != LIMIT_FIELDS["burst"]:
        raise LockConfigurationError(f"{owner}: '{prefix}burst' is given without a '{prefix}rate'")
    return LimitRule(
        key=KeyTemplate(values["key"], func, owner=owner, default=task_name),
        slots=None if slots is None else check_slots(slots, owner, f"{prefix}slots"),
        rate=None if rate is None else Rate.parse(rate, values["burst"], owner=owner),
        lease=check_lease(values["lease"], owner, f"{prefix}lease"),
    )


def _retry_policy(owner: str, values: Mapping[str, Any], prefix: str) -> RetryPolicy:
    jitter = values["retry_jitter"]
    if not isinstance(jitter, bool):
        raise LockConfigurationError(
            f"{owner}: {prefix}retry_jitter must be True or False, not {jitter!r}"
        )
    max_wait = values["max_wait"]
    return RetryPolicy(
        backoff=_seconds(values["retry_backoff"], owner, f"{prefix}retry_backoff"),
        backoff_max=_seconds(values["retry_backoff_max"], owner, f"{prefix}retry_backoff_max"),
        jitter=jitter,
        max_wait=None if max_wait is None else _seconds(max_wait, owner, f"{prefix}max_wait"),
    )


def _seconds(value: Any, owner: str, option: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise LockConfigurationError(
            f"{owner}: {option} must be a number of seconds (0 or more), not {value!r}"
        )
    return float(value)
