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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .scripts import LuaScript

__all__ = ["BAND_MARK", "FairLine", "SubLine", "fair_key", "fair_view", "oldest_waiters",
           "set_weight", "weights", "with_band"]

FAIR_VIEW = LuaScript.load("fair_view.lua", after=["fair.lua"], flags="no-writes")
FAIR_OLDEST = LuaScript.load("fair_oldest.lua", after=["fair.lua"], flags="no-writes")

#: The most bands of one tenant :func:`oldest_waiters` reads (the first by head score).
MOST_BANDS = 16

#: The default ``lock_priority_aging`` (s): what one band is worth when none is given.
DEFAULT_AGING = 10.0

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
    found = _banded.get((limiter, priority))
    if found is None:
        if len(_banded) >= _BANDED_KEPT:
            _banded.clear()
        found = _banded[(limiter, priority)] = dataclasses.replace(
            limiter, fair=f"{limiter.fair}{BAND_MARK}{int(priority)}")
    return found


#: :func:`with_band`'s answers, by limiter and priority: a run's limiter in its band is
#: the same for every run of a task with a constant key (a semaphore key and its digest
#: worked out once, not per run); at most :data:`_BANDED_KEPT` kept.
_banded: Dict[Tuple[Any, Any], Any] = {}
_BANDED_KEPT = 4096


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
    parking queue that no move was owed for yet, and ``weight``; ``oldest_age`` (s) of
    its oldest waiter when known (:func:`oldest_waiters`), else None."""

    sub: str
    turn: float
    waiting: int
    weight: float
    oldest_age: Optional[float] = None


@dataclass(frozen=True)
class FairLine:
    """The sub-lines of a fair line: how many wait, the virtual time, the first by turn."""

    waiting: int
    virtual_time: float
    first: Tuple[SubLine, ...]


def fair_view(client: Any, key: str, top: int = 10,
              aging: Optional[float] = DEFAULT_AGING) -> FairLine:
    """The fair line of semaphore ``key``: the number of sub-lines waiting and the
    ``top`` first by turn (one read-only script, O(top)), each with its oldest waiter's
    age where it is kept (:func:`oldest_waiters`, a second read-only script, O(top x
    log bands); ``aging``: the limit's ``lock_priority_aging``, s; None: not read).

        >>> import redis
        >>> fair_view(redis.Redis.from_url(redis_url), "doc:{v}:s:nobody")
        FairLine(waiting=0, virtual_time=0.0, first=())
    """
    reply = FAIR_VIEW.run(client, [key], [int(top)])
    rows: List[SubLine] = []
    for at in range(2, len(reply), 4):
        rows.append(SubLine(_text(reply[at]), float(reply[at + 1]), int(reply[at + 2]),
                            float(reply[at + 3])))
    if rows and aging is not None:
        ages = oldest_waiters(client, key, [row.sub for row in rows], aging)
        rows = [dataclasses.replace(row, oldest_age=ages.get(row.sub)) for row in rows]
    return FairLine(int(reply[0]), float(reply[1]), tuple(rows))


def oldest_waiters(client: Any, key: str, tenants: Sequence[str],
                   aging: float = DEFAULT_AGING) -> Dict[str, float]:
    """``{tenant: age (s) of its oldest waiter}`` for those of ``tenants`` (sub-lines of
    semaphore ``key``) whose runs wait in priority bands, on the server's clock.

    ``lua/fair.lua`` keeps, per band of a tenant, the FIFO of its runs' scores
    (``since - band x aging``) and the tenant's bands by their head's score: a band's
    head is its oldest run, so the tenant's oldest is the least ``score + band x aging``
    over its bands (the first :data:`MOST_BANDS` by head score are read). Runs that
    wait without a priority (no ``lock_priority``, no message priority) keep no FIFO:
    their tenant is left out (its oldest waiter is not known). ``aging`` (s) is the
    limit's ``lock_priority_aging``; it cancels out for a tenant with one band, 0.

        >>> import redis
        >>> oldest_waiters(redis.Redis.from_url(redis_url), "doc:{o}:s:none", ["t:a"])
        {}
    """
    if not tenants:
        return {}
    reply = FAIR_OLDEST.run(client, [key], [MOST_BANDS, *tenants])
    now_ms, at = int(reply[0]), 1
    ages: Dict[str, float] = {}
    for tenant in tenants:
        count = int(reply[at])
        pairs = reply[at + 1: at + 1 + 2 * count]
        at += 1 + 2 * count
        since = [float(pairs[i + 1]) + float(pairs[i]) * aging * 1000
                 for i in range(0, len(pairs), 2)]
        if since:
            ages[tenant] = max(0.0, now_ms - min(since)) / 1000
    return ages


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
