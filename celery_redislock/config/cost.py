"""A run's weight (``lock_cost``): how many slots it takes and rate starts it uses at once.

A cost is a whole number, or a callable of the task's arguments (given by name, as a
``lock_key`` callable is) that returns one for each call. A number is checked against
its limit when the task is defined; a callable's answer is checked for each call, and a
run whose cost could never be admitted fails with :class:`LockCostError`::

    >>> def export(ids, priority=0): ...
    >>> cost = check_cost("Task 'export'", lambda ids: len(ids), slots=10, rate=None,
    ...                   prefix="lock_", func=export)
    >>> cost((["a", "b", "c"],), {})
    3
    >>> check_cost("Task 'export'", 3, slots=10, rate=None, prefix="lock_", func=export)
    3
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

from ..engine.key_template import KeyTemplate
from ..engine.rate import Rate
from ..errors import LockConfigurationError, LockCostError

#: The highest cost: the highest burst + 1 (and above the most slots a limit may have).
MAX_COST = 1_000_001


class CallableCost:
    """``lock_cost`` given as a callable: the cost of each call, checked."""

    def __init__(self, source: Callable[..., Any], func: Callable[..., Any], *, owner: str,
                 option: str, slots: Optional[int], rate: Optional[Rate],
                 prefix: str) -> None:
        # The task's arguments reach the callable as they reach a lock_key callable.
        self._arguments = KeyTemplate(source, func, owner=owner, option=option)
        self.source = source
        self.owner = owner
        self.option = option
        self._ceilings = _ceilings(slots, rate, prefix)

    def __call__(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
        """The cost of one call; :class:`LockCostError` if it cannot be worked out or no
        run could ever be admitted with it."""
        name = getattr(self.source, "__name__", type(self.source).__name__) + "()"
        try:
            value = self.source(**self._arguments.arguments_for(args, kwargs))
        except Exception as exc:
            raise LockCostError(
                f"{self.owner}: {self.option} {name} failed for a call with {len(args)} "
                f"positional argument(s) and keyword(s) {sorted(kwargs)}: "
                f"{type(exc).__name__}: {exc}") from exc
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LockCostError(f"{self.owner}: {self.option} {name} gave {value!r} for this "
                                "call; a cost is a whole number, 1 or more")
        for ceiling, what in self._ceilings:
            if value > ceiling:
                raise LockCostError(
                    f"{self.owner}: {self.option} {name} gave {value} for this call, above "
                    f"{what}: the run could never be admitted")
        return value

    def __repr__(self) -> str:
        return f"CallableCost({self.source!r})"


Cost = Union[int, CallableCost]


def check_cost(owner: str, cost: Any, *, slots: Optional[int], rate: Optional[Rate],
               prefix: str, func: Callable[..., Any]) -> Cost:
    """``cost`` checked against the limit it weighs (``slots`` and/or ``rate``): the number
    itself, or a :class:`CallableCost`; else :class:`LockConfigurationError` listing every
    problem (a cost above the slots, or above what the rate lets start at once, means no
    run could ever start)."""
    option = f"{prefix}cost"
    if callable(cost) and not isinstance(cost, type):
        return CallableCost(cost, func, owner=owner, option=option, slots=slots, rate=rate,
                            prefix=prefix)
    if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
        raise LockConfigurationError(
            f"{owner}: {option} must be a whole number, 1 to {MAX_COST}, or a callable of "
            f"the task's arguments, not {cost!r}")
    problems: List[str] = []
    if slots is not None and cost > slots:
        problems.append(
            f"{owner}: {option} {cost} is above {prefix}slots {slots}, so no run could ever "
            f"be admitted; raise {prefix}slots to at least {cost}")
    if rate is not None and cost > rate.burst + 1:
        problems.append(
            f"{owner}: {option} {cost} is above what the rate lets start at once "
            f"({prefix}burst + 1 = {rate.burst + 1}), so no run could ever start; raise "
            f"{prefix}burst to at least {cost - 1}")
    if problems:
        raise LockConfigurationError.listing(owner, problems)
    return cost


def _ceilings(slots: Optional[int], rate: Optional[Rate], prefix: str) -> List[Any]:
    """(highest cost, what it is) for each limit a cost weighs."""
    ceilings: List[Any] = []
    if slots is not None:
        ceilings.append((slots, f"{prefix}slots {slots}"))
    if rate is not None:
        ceilings.append((rate.burst + 1, f"what the rate lets start at once ({prefix}burst "
                                          f"+ 1 = {rate.burst + 1})"))
    return ceilings
