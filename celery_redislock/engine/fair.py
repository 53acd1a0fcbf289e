"""Fair shares on the parked line: the sub-lines of a fair limit, their weights and turns.

A limit of slots that declares ``fair_by`` (``{"slots": 10, "fair_by": "tenant:{tenant}"}``,
or the task option ``lock_fair_by``) has its parked line split in one *sub-line* per key
that template gives a run (``"tenant:acme"``), each with its own parking queue in the
broker. A slot handed to the line goes to the sub-line whose *turn* is lowest, and
that sub-line's turn moves on by ``1 / weight`` (start-time fair queuing: a sub-line
that starts waiting takes ``max(virtual time, the turn it left with)``). The choice is
one ``ZRANGE 0 0`` inside the script that hands the slot over, whatever the number of
sub-lines waiting (``lua/fair.lua``).

Weights (default 1) are set at run time per semaphore and sub-line; a weight of 3 gets
three turns for another's one while both wait::

    set_weight(client, semaphore_key("proj.work"), "tenant:acme", 3)

:func:`fair_view` reads the first sub-lines by turn, for ``status`` and ``inspect``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from .scripts import LuaScript

__all__ = ["BAND_MARK", "FairLine", "SubLine", "fair_key", "fair_view", "set_weight",
           "weights", "with_band"]

FAIR_VIEW = LuaScript.load("fair_view.lua", after=["fair.lua"], flags="no-writes")

#: Between a sub-line's tenant and its priority band (``lua/fair.lua``).
BAND_MARK = "\x1e"

#: The highest weight a sub-line may have.
MAX_WEIGHT = 1_000_000.0


def fair_key(key: str, mark: str) -> str:
    """A companion of semaphore ``key`` (``"ft"`` turns, ``"fn"`` state, ``"fw"``
    weights), as ``lua/fair.lua`` names it.

        >>> fair_key("redislock:{ab}:s:work", "fw")
        'redislock:{ab}:fw:work'
    """
    head, found, name = key.partition("}:s:")
    if not found:
        return f"{key}:{mark}"
    return f"{head}}}:{mark}:{name}"


def with_band(limiter: Any, priority: int) -> Any:
    """``limiter`` (a :class:`~.admission.SlotLimit`) with its run in band ``priority``
    of its sub-line (a line that is not fair has one tenant, ``""``); any other limiter
    as it is.

        >>> from celery_redislock.engine.admission import SlotLimit
        >>> with_band(SlotLimit("w", 2, "p:", 1, "tenant:a"), 5).fair == "tenant:a\x1e5"
        True
    """
    if not hasattr(limiter, "fair"):
        return limiter
    return dataclasses.replace(limiter, fair=f"{limiter.fair}{BAND_MARK}{int(priority)}")


def check_weight(weight: Any) -> float:
    """``weight`` as a float in (0, :data:`MAX_WEIGHT`]; ValueError otherwise.

        >>> check_weight(3), check_weight("0.5")
        (3.0, 0.5)
    """
    try:
        value = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"a weight must be a number above 0, not {weight!r}") from None
    if isinstance(weight, bool) or not math.isfinite(value) or not 0 < value <= MAX_WEIGHT:
        raise ValueError(f"a weight must be a number above 0 and at most {MAX_WEIGHT:g}, "
                         f"not {weight!r}")
    return value


def set_weight(client: Any, key: str, sub: str, weight: float) -> float:
    """Give sub-line ``sub`` of semaphore ``key`` the ``weight`` (1 drops the setting:
    the default). Takes effect at the sub-line's next turn. One command.

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> set_weight(client, "doc:{w}:s:work", "tenant:a", 3)
        3.0
        >>> weights(client, "doc:{w}:s:work")
        {'tenant:a': 3.0}
    """
    value = check_weight(weight)
    if value == 1.0:
        client.hdel(fair_key(key, "fw"), sub)
    else:
        client.hset(fair_key(key, "fw"), sub, repr(value))
    return value


def weights(client: Any, key: str) -> Dict[str, float]:
    """The weights set on the sub-lines of semaphore ``key`` (those not set are 1)."""
    return {_text(sub): float(value)
            for sub, value in client.hgetall(fair_key(key, "fw")).items()}


@dataclass(frozen=True)
class SubLine:
    """One sub-line waiting: its ``sub`` key, ``turn``, messages ``waiting`` in its
    parking queue that no move was owed for yet, and ``weight``."""

    sub: str
    turn: float
    waiting: int
    weight: float


@dataclass(frozen=True)
class FairLine:
    """The sub-lines of a fair line: how many wait, the virtual time, the first by turn."""

    waiting: int
    virtual_time: float
    first: Tuple[SubLine, ...]


def fair_view(client: Any, key: str, top: int = 10) -> FairLine:
    """The fair line of semaphore ``key``: the number of sub-lines waiting and the
    ``top`` first by turn (one read-only script, O(top)).

        >>> import redis
        >>> fair_view(redis.Redis.from_url(redis_url), "doc:{v}:s:nobody")
        FairLine(waiting=0, virtual_time=0.0, first=())
    """
    reply = FAIR_VIEW.run(client, [key], [int(top)])
    rows: List[SubLine] = []
    for at in range(2, len(reply), 4):
        rows.append(SubLine(_text(reply[at]), float(reply[at + 1]), int(reply[at + 2]),
                            float(reply[at + 3])))
    return FairLine(int(reply[0]), float(reply[1]), tuple(rows))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
