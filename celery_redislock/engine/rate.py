"""Rates such as ``"100/m"``: parsing, and the spacing they imply."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import LockConfigurationError

_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60,
          "h": 3600, "hour": 3600, "d": 86400, "day": 86400}

_RATE = re.compile(
    r"^\s*(?P<count>\d+(?:\.\d+)?)\s*/\s*(?P<multiple>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+?)s?\s*$"
)


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
    def parse(cls, text: Any, burst: Any = 1, owner: str = "rate") -> Rate:
        """Read ``"N/s"``, ``"N/m"``, ``"N/h"``, ``"N/d"`` or ``"N/<k><unit>"`` (``"5/10s"``)."""
        if isinstance(text, Rate):
            return text
        match = _RATE.match(text) if isinstance(text, str) else None
        unit = _UNITS.get(match.group("unit")) if match else None
        if match is None or unit is None:
            raise LockConfigurationError(
                f"{owner}: rate {text!r} is not a rate; write N/s, N/m, N/h or N/<k>s, "
                "e.g. '100/m' or '5/10s'"
            )
        count = float(match.group("count"))
        period = float(match.group("multiple") or 1) * unit
        if count <= 0 or period <= 0:
            raise LockConfigurationError(f"{owner}: rate {text!r} must be above zero")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
            raise LockConfigurationError(
                f"{owner}: burst must be a whole number, 0 or more, not {burst!r}"
            )
        return cls(count=count, period=period, burst=burst)

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate."""
        return self.period / self.count

    def __str__(self) -> str:
        count = int(self.count) if self.count.is_integer() else self.count
        period = int(self.period) if self.period.is_integer() else self.period
        return f"{count}/{period}s (burst {self.burst})"
