"""Rates such as ``"100/m"``: parsing, and the spacing they imply."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..errors import LockConfigurationError
from .bounds import in_range, is_number, shown, span

#: Every spelling of a unit a rate may use, and its length in seconds. Nothing else is
#: read: ``"5/ms"`` or ``"10/hs"`` is refused, not taken for minutes or hours.
UNITS: Dict[str, int] = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}

#: The steady interval between two starts: from 1 µs (a million a second) to a week.
MIN_INTERVAL, MAX_INTERVAL = 1e-6, 7 * 86400.0

#: The largest ``burst``.
MAX_BURST = 1_000_000

_RATE = re.compile(
    r"^\s*(?P<count>\d+(?:\.\d+)?)\s*/\s*(?P<multiple>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*$"
)

_SPELLINGS = "s, sec(s), second(s), m, min(s), minute(s), h, hr(s), hour(s), d, day(s)"


@dataclass(frozen=True)
class Rate:
    """``count`` starts per ``period`` seconds, and ``burst`` more at the most.

    Starts are spaced ``period / count`` apart at the steady rate; a start may come up to
    ``burst`` intervals early, so after a quiet spell ``burst + 1`` may start at once, and a
    run delayed on its way (the broker's delivery delay) is made up for. In any window of
    ``period`` seconds there are never more than ``count + burst`` starts. ``burst=0``
    spaces every start a full interval apart.

        >>> Rate.parse("100/m").interval
        0.6
        >>> Rate.parse("5/10s", burst=0)
        Rate(count=5.0, period=10.0, burst=0)
    """

    count: float
    period: float
    burst: int = 1

    @classmethod
    def parse(cls, text: Any, burst: Any = 1, owner: str = "rate", *, prefix: str = "") -> Rate:
        """Read ``"N/<unit>"`` or ``"N/<k><unit>"`` (``"100/m"``, ``"5/10s"``, ``"2/hours"``),
        the unit one of :data:`UNITS`; or check a :class:`Rate`.

        Raises :class:`LockConfigurationError` listing every problem of the rate and the
        burst; ``prefix`` (``"lock_"``) is put before ``rate`` and ``burst`` in messages.
        """
        if isinstance(text, Rate):
            count_period: Optional[Tuple[float, float]] = (text.count, text.period)
            burst = text.burst
        else:
            count_period = _read(text)
        problems = []
        if count_period is None:
            problems.append(
                f"{owner}: {prefix}rate {shown(text)} is not a rate; write N/<unit> or "
                f"N/<k><unit>, the unit one of {_SPELLINGS}, e.g. '100/m' or '5/10s'"
            )
        else:
            wrong = _interval_problem(*count_period)
            if wrong:
                problems.append(f"{owner}: {prefix}rate {shown(text)} {wrong}")
        if not isinstance(burst, int) or not in_range(burst, 0, MAX_BURST):
            problems.append(f"{owner}: {prefix}burst must be a whole number, "
                            f"{span(0, MAX_BURST)}, not {shown(burst)}")
        if problems or count_period is None:
            raise LockConfigurationError.listing(owner, problems)
        return cls(count=count_period[0], period=count_period[1], burst=burst)

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate."""
        return self.period / self.count

    def __str__(self) -> str:
        count = int(self.count) if self.count.is_integer() else self.count
        period = int(self.period) if self.period.is_integer() else self.period
        return f"{count}/{period}s (burst {self.burst})"


def _read(text: Any) -> Optional[Tuple[float, float]]:
    """``(count, period)`` of a rate's text, or None when it is not written as a rate."""
    match = _RATE.match(text) if isinstance(text, str) else None
    unit = UNITS.get(match.group("unit")) if match else None
    if match is None or unit is None:
        return None
    return float(match.group("count")), float(match.group("multiple") or 1) * unit


def _interval_problem(count: Any, period: Any) -> Optional[str]:
    if not (is_number(count) and is_number(period) and count > 0 and period > 0):
        return "must be above zero"
    interval = period / count
    if not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        return (f"allows a start every {interval:g} s; the interval between starts must be "
                f"{span(MIN_INTERVAL, MAX_INTERVAL)} s")
    return None
