"""The ranges numbers given in a limit's definition must fall in, and how errors show them.

Every number a definition gives is checked against a closed range, so ``inf``, ``nan``,
``1e300`` or ``10**400`` are refused where they are written, not met in a worker.

    >>> in_range(30, 0.1, 86400), in_range(float("nan"), 0.1, 86400)
    (True, False)
    >>> span(0.1, 86400)
    'from 0.1 to 86400'
"""

from __future__ import annotations

from typing import Any

#: Shown values are cut to this many characters (``10**400`` has 401 digits).
SHOWN_LENGTH = 40


def is_number(value: Any) -> bool:
    """True for an int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def in_range(value: Any, low: float, high: float) -> bool:
    """True when ``value`` is a number from ``low`` to ``high`` (never for nan)."""
    return is_number(value) and low <= value <= high


def span(low: float, high: float) -> str:
    """``'from 0.1 to 86400'``: the range as an error message says it."""
    return f"from {_plain(low)} to {_plain(high)}"


def shown(value: Any) -> str:
    """``repr(value)``, cut short when it is long.

        >>> shown(10**60)
        '1000000000000000000000000000000000000000... (61 characters)'
    """
    text = repr(value)
    if len(text) <= SHOWN_LENGTH:
        return text
    return f"{text[:SHOWN_LENGTH]}... ({len(text)} characters)"


def _plain(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))
