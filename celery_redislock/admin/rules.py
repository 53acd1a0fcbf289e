"""What an app's tasks say about a limit name, and how a rate is written for people.

One place for what ``status``, ``watch``, ``inspect`` and the web dashboard show about a
name's configured slots and rate:

* :func:`rate_text` writes a rate the way a task's options do (``"30/m"``, ``"5/10s
  (burst 0)"``): the one formatter of every view.
* A rule's ``lock_key`` makes a name when its template could render it
  (:meth:`~celery_redislock.engine.key_template.KeyTemplate.could_render`: a field
  matches what a value can render to, a ``{field:hash}`` only its 16 hex digits), so
  ``api:{token}`` does not make ``api:a:b``.
* :class:`Rules` finds the slots and rate of a name. Where two templates can make the
  same name (``api:{token}`` and ``api:{token:hash}``) and disagree, Redis decides: the
  interval the rate limiter's state was last counted in, then the tasks of its live
  holders; when nothing tells them apart, the answer is unknown, never the
  other task's.

    >>> from celery_redislock.engine.rate import Rate
    >>> rate_text(Rate.parse("10/s")), rate_text(Rate.parse("5/10s", burst=0))
    ('10/s', '5/10s (burst 0)')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Iterable, List, Optional, Tuple

from ..config.limits_setting import config_limits, task_function
from ..engine.rate import Rate
from ..run.limited import limits_of
from .state import LimitState

#: The unit a period of that many seconds is written with.
_UNITS = {1.0: "s", 60.0: "m", 3600.0: "h", 86400.0: "d"}

#: What a view shows for a rate it cannot tell (two templates that disagree).
UNKNOWN = "?"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def rate_text(rate: Rate) -> str:
    """A rate as a task's options write it: ``"30/m"``, ``"5/10s"``, the burst only when
    it is not the default 1.

        >>> rate_text(Rate.parse("100/2m")), rate_text(Rate.parse("1.5/h", burst=3))
        ('100/2m', '1.5/h (burst 3)')
    """
    count = _number(rate.count)
    period = float(rate.period)
    unit = _UNITS.get(period)
    if unit is None:
        unit = next((f"{_number(period / size)}{name}" for size, name in
                     sorted(_UNITS.items(), reverse=True)
                     if period >= size and (period / size).is_integer()),
                    f"{_number(period)}s")
    return f"{count}/{unit}" + ("" if rate.burst == 1 else f" (burst {rate.burst})")


def override_text(text: str) -> str:
    """A rate set at run time (``set-rate``), written like every other rate.

        >>> override_text("600 / minute"), override_text("not a rate")
        ('600/m', 'not a rate')
    """
    try:
        return rate_text(Rate.parse(text))
    except Exception:  # written by hand into Redis: shown as it is, as text
        return text


def interval_text(interval_us: float) -> str:
    """The rate of one start every ``interval_us`` µs (what Redis records of a rate).

        >>> interval_text(100_000), interval_text(2_000_000), interval_text(7_000)
        ('10/s', '30/m', '142.857/s')
    """
    seconds = interval_us / 1e6
    for period in sorted(_UNITS):
        count = period / seconds
        if abs(count - round(count)) < 1e-9 * count and round(count) >= 1:
            return rate_text(Rate(count=float(round(count)), period=period))
    return rate_text(Rate(count=round(1 / seconds, 3), period=1.0))


def task_rules(app: Any) -> Iterable[Tuple[Any, Any]]:
    """(task, rule) of every limit rule of the app's registered tasks."""
    for name, task in list(app.tasks.items()):
        try:
            limits = limits_of(task) or config_limits(app, name, task_function(task))
        except Exception:  # a broken limit: `celery check_limits`'s business, not ours
            continue
        if limits is None:
            continue
        for rule in limits.rules:
            yield task, rule


def _aging(task: Any) -> Optional[float]:
    """``task``'s ``lock_priority_aging`` (s), None if it cannot be read."""
    try:
        limits = limits_of(task)
    except Exception:
        return None
    return None if limits is None else float(limits.retry.priority_aging)


@dataclass(frozen=True)
class _Rule:
    task: str
    key: Any  # its KeyTemplate
    slots: Optional[int]
    rate: Optional[Rate]
    #: The task's ``lock_priority_aging`` (s) when the rule is fair (``fair_by``).
    aging: Optional[float] = None

    def makes(self, name: str) -> bool:
        return self.key.could_render(name) is True


class Rules:
    """The slot counts and rates an app's tasks give limit names.

        >>> from celery import Celery
        >>> from celery_redislock import LimitedTask
        >>> app = Celery("proj", set_as_current=False)
        >>> @app.task(base=LimitedTask, lock_rate="10/s", lock_key="api:{token}",
        ...           name="proj.call")
        ... def call(token): ...
        >>> @app.task(base=LimitedTask, lock_slots=2, lock_key="api:{token:hash}",
        ...           name="proj.fetch")
        ... def fetch(token): ...
        >>> rules, hashed = Rules(app), "api:4e738ca5563c06cf"
        >>> rules.rate_of("api:t1"), rules.slots_of("api:t1")
        ('10/s', None)
        >>> rules.rate_of(hashed), rules.rate_of(hashed, tasks=["proj.fetch"])
        ('?', None)
        >>> rules.rate_of(hashed, interval_us=100_000), rules.slots_of(hashed)
        ('10/s', 2)
    """

    def __init__(self, app: Any) -> None:
        self.rules: List[_Rule] = []
        for task, rule in task_rules(app):
            aging = _aging(task) if getattr(rule, "fair_by", None) is not None else None
            self.rules.append(_Rule(task.name, rule.key, rule.slots, rule.rate, aging))

    def aging_of(self, name: str) -> Optional[float]:
        """The ``lock_priority_aging`` (s) of the fair limit ``name`` (what one priority
        band is worth on its line); None if no fair rule makes it, or they disagree."""
        found = {rule.aging for rule in self.matching(name) if rule.aging is not None}
        return next(iter(found)) if len(found) == 1 else None

    def matching(self, name: str, tasks: Collection[str] = ()) -> List[_Rule]:
        """The rules whose key can make ``name``; only those of ``tasks`` (the tasks seen
        holding or waiting on it) when some of them are among them."""
        found = [rule for rule in self.rules if rule.makes(name)]
        mine = [rule for rule in found if rule.task in tasks]
        return mine or found

    def slots_of(self, name: str, tasks: Collection[str] = ()) -> Optional[int]:
        """The slot count the tasks give limit ``name``; None if none or several."""
        counts = {rule.slots for rule in self.matching(name, tasks) if rule.slots is not None}
        return next(iter(counts)) if len(counts) == 1 else None

    def rate_of(self, name: str, *, interval_us: Optional[float] = None,
                tasks: Collection[str] = ()) -> Optional[str]:
        """The rate of limit ``name`` as :func:`rate_text` writes it; None without one,
        :data:`UNKNOWN` when its templates disagree and nothing in Redis tells.

        ``interval_us`` is the interval Redis recorded with the name's rate limiter's
        state (it limits starts now); ``tasks`` the tasks of its holders.
        """
        if interval_us:
            found = {rate_text(rule.rate) for rule in self.rules
                     if rule.rate is not None and rule.makes(name)
                     and abs(rule.rate.interval * 1e6 - interval_us) <= 1e-6 * interval_us}
            return found.pop() if len(found) == 1 else interval_text(interval_us)
        rates = {None if rule.rate is None else rate_text(rule.rate)
                 for rule in self.matching(name, tasks)}
        if len(rates) > 1:
            return UNKNOWN
        return rates.pop() if rates else None


def configured_rate(state: LimitState, rules: Optional[Rules] = None) -> Optional[str]:
    """The rate the name's tasks give it (:meth:`Rules.rate_of`); without ``rules``, the
    one Redis recorded with its rate limiter's state, if any."""
    if rules is not None:
        return rules.rate_of(state.name, interval_us=state.rate_interval_us,
                             tasks=state.tasks)
    return None if not state.rate_interval_us else interval_text(state.rate_interval_us)


def rate_column(state: LimitState, rules: Optional[Rules] = None) -> str:
    """What every view shows of a name's rate: the rate set at run time, marked, else the
    configured one, else ``-``.

        >>> rate_column(LimitState("n", "k", 0, rate_override="600/minute"))
        '600/m (set-rate)'
        >>> rate_column(LimitState("n", "k", 0, rate_limiter=True, rate_interval_us=1e5))
        '10/s'
        >>> rate_column(LimitState("n", "k", 0))
        '-'
    """
    if state.rate_override is not None:
        return f"{override_text(state.rate_override)} (set-rate)"
    return configured_rate(state, rules) or "-"


def used_text(state: LimitState) -> str:
    """Slots used out of the limit (``2/4``; ``2/?`` when the limit is not known), or
    ``-`` for a name that has no semaphore (a rate alone limits it).

        >>> used_text(LimitState("n", "k", 0, exists=True, configured_slots=4))
        '0/4'
        >>> used_text(LimitState("n", "k", 0, rate_limiter=True))
        '-'
    """
    if state.limit is None and not state.exists and not state.used:
        return "-"
    return f"{state.used}/{'?' if state.limit is None else state.limit}"
