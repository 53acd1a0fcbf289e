"""Weights of the sub-lines of a fair limit (``fair_by``), and what its line holds.

A limit of slots with ``fair_by`` serves its parked line round-robin across the keys of
the runs (``"tenant:acme"``); each such sub-line has a weight, 1 unless set here. A
weight of 3 gets three turns for another's one while both wait; the change takes effect
at the sub-line's next turn, on every worker at once (it is kept in the lock store).

    >>> set_weight(app, "proj.work", "tenant:acme", 3)  # doctest: +SKIP
    3.0
    >>> fair_state(app, "proj.work").first[0]  # doctest: +SKIP
    SubLine(sub='tenant:big', turn=41.0, waiting=9912, weight=1.0)

From the shell: ``celery -A proj redislock set-weight proj.work tenant:acme 3``,
``clear-weight``, and ``fair proj.work`` (the sub-lines waiting, first by turn).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..engine import fair
from ..engine.fair import FairLine
from .control import LimitControlError, _target, limit_keys

__all__ = ["FairLine", "check_weight_value", "clear_weight", "fair_state", "set_weight",
           "weights"]


def check_weight_value(weight: Any, name: str, sub: str) -> float:
    """``weight`` as a weight (a number above 0), or :class:`LimitControlError`.

        >>> check_weight_value("2.5", "proj.work", "tenant:a")
        2.5
    """
    try:
        return fair.check_weight(weight)
    except ValueError as exc:
        raise LimitControlError(f"weight of {sub!r} in {name!r}: {exc}") from None


def set_weight(app_or_client: Any, name: str, sub: str, weight: float, *,
               prefix: Optional[str] = None) -> float:
    """Give sub-line ``sub`` (a key ``fair_by`` renders, e.g. ``"tenant:acme"``) of the
    fair limit ``name`` the ``weight``. Returns the weight set."""
    value = check_weight_value(weight, name, sub)
    client, prefix, _ = _target(app_or_client, prefix)
    key, _ = limit_keys(name, prefix)
    return fair.set_weight(client, key, sub, value)


def clear_weight(app_or_client: Any, name: str, sub: str, *,
                 prefix: Optional[str] = None) -> bool:
    """Back to the default weight (1). Returns whether a weight was set."""
    client, prefix, _ = _target(app_or_client, prefix)
    key, _ = limit_keys(name, prefix)
    return bool(client.hdel(fair.fair_key(key, "fw"), sub))


def weights(app_or_client: Any, name: str, *, prefix: Optional[str] = None
            ) -> Dict[str, float]:
    """The weights set on the sub-lines of ``name`` (the others are 1)."""
    client, prefix, _ = _target(app_or_client, prefix)
    return fair.weights(client, limit_keys(name, prefix)[0])


def fair_state(app_or_client: Any, name: str, *, top: int = 10,
               prefix: Optional[str] = None,
               aging: Optional[float] = fair.DEFAULT_AGING) -> FairLine:
    """The sub-lines of ``name`` waiting: how many, and the ``top`` first by turn, with
    their oldest waiter's age where kept (``aging``: the limit's
    ``lock_priority_aging``, s; see :func:`~..engine.fair.oldest_waiters`)."""
    client, prefix, _ = _target(app_or_client, prefix)
    return fair.fair_view(client, limit_keys(name, prefix)[0], top, aging)
