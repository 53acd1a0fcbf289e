"""What the dashboard shows: the state of every key of an app, with a short history.

The state is read with the admin layer's read-only reads (the ``status`` and
``inspect`` commands' rows); the history is a ring buffer per key in the dashboard's
process, one sample per refresh.

    >>> history = History(size=3)
    >>> for second in range(5):
    ...     history.add({"k": (second, 0)}, float(second))
    >>> [sample[0] for sample in history.of("k")]
    [2.0, 3.0, 4.0]
"""

from __future__ import annotations

import re
import string
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Pattern, Tuple

from ..admin.cli import LockStore, inspect_json, known_limits, status_row, task_rules
from ..admin.state import LimitState

#: One history sample: (Unix seconds on the Redis server's clock, used, waiting).
Sample = Tuple[float, int, int]


class History:
    """The last ``size`` samples of (used, waiting) of each key, in memory."""

    def __init__(self, size: int = 120) -> None:
        self.size = size
        self._samples: Dict[str, Deque[Sample]] = {}

    def add(self, values: Mapping[str, Tuple[int, int]], at: float) -> None:
        """Record ``{key: (used, waiting)}`` at ``at``; keys not given are forgotten."""
        for key in list(self._samples):
            if key not in values:
                del self._samples[key]
        for key, (used, waiting) in values.items():
            self._samples.setdefault(key, deque(maxlen=self.size)).append(
                (at, used, waiting))

    def of(self, key: str) -> List[Sample]:
        """The samples of ``key``, oldest first."""
        return list(self._samples.get(key, ()))


def name_pattern(rule: Any) -> Optional[Pattern[str]]:
    """A pattern of the limit names ``rule`` makes: its ``lock_key`` template with each
    field standing for any text; None for a key made by a callable.

        >>> from celery_redislock.config.limit import LimitRule
        >>> from celery_redislock.engine.keys import KeyTemplate
        >>> def sync(tenant): ...
        >>> rule = LimitRule(KeyTemplate("crm:{tenant}", sync, owner="t"), 2, None, 30)
        >>> bool(name_pattern(rule).fullmatch("crm:acme"))
        True
    """
    key = rule.key
    if key.is_constant:
        return re.compile(re.escape(key.render((), {})))
    if not isinstance(key.source, str):
        return None
    parts = [re.escape(literal) + ("" if field is None else "(?:.+?)")
             for literal, field, _, _ in string.Formatter().parse(key.source)]
    return re.compile("".join(parts), re.S)


_PERIODS = {1.0: "s", 60.0: "m", 3600.0: "h", 86400.0: "d"}


def rate_text(rate: Any) -> str:
    """A rate as written in a task's options: ``"30/m"``, ``"5/10s (burst 0)"``.

        >>> from celery_redislock.engine.rate import Rate
        >>> rate_text(Rate.parse("30/m")), rate_text(Rate.parse("5/10s", burst=0))
        ('30/m', '5/10s (burst 0)')
    """
    count = int(rate.count) if float(rate.count).is_integer() else rate.count
    period = _PERIODS.get(float(rate.period))
    if period is None:
        period = f"{int(rate.period) if float(rate.period).is_integer() else rate.period}s"
    return f"{count}/{period}" + ("" if rate.burst == 1 else f" (burst {rate.burst})")


class Rules:
    """The slot counts and rate limits (``"30/m"``) of an app's tasks, by the limit
    names their keys make: what a key shows before any run of it recorded its count.

        >>> from celery import Celery
        >>> from celery_redislock import LimitedTask
        >>> app = Celery("proj", set_as_current=False)
        >>> @app.task(base=LimitedTask, lock_slots=2, lock_rate="5/s",
        ...           lock_key="api:{token}", name="proj.call")
        ... def call(token): ...
        >>> rules = Rules(app)
        >>> rules.rate_of("api:t1"), rules.slots_of("api:t1"), rules.rate_of("other")
        ('5/s', 2, None)
    """

    def __init__(self, app: Any) -> None:
        self.rules: List[Tuple[Pattern[str], Optional[int], Optional[str]]] = []
        for _, rule in task_rules(app):
            pattern = name_pattern(rule)
            if pattern is not None:
                rate = None if rule.rate is None else rate_text(rule.rate)
                self.rules.append((pattern, rule.slots, rate))

    def _matching(self, name: str) -> List[Tuple[Optional[int], Optional[str]]]:
        return [(slots, rate) for pattern, slots, rate in self.rules
                if pattern.fullmatch(name)]

    def rate_of(self, name: str) -> Optional[str]:
        """The rate(s) of limit ``name``, joined with ``", "``; None without one."""
        found: List[str] = []
        for _, rate in self._matching(name):
            if rate is not None and rate not in found:
                found.append(rate)
        return ", ".join(found) or None

    def slots_of(self, name: str) -> Optional[int]:
        """The slot count the tasks give limit ``name``; None if none or several."""
        counts = {slots for slots, _ in self._matching(name) if slots is not None}
        return next(iter(counts)) if len(counts) == 1 else None


def key_json(state: LimitState, rate: Optional[str], history: List[Sample]) -> Dict[str, Any]:
    """One key of ``/api/state``: the ``status --json`` row (``holders`` renamed
    ``holder_count``) with the ``inspect --json`` holders and waiters, its rate and
    history."""
    row = status_row(state)
    row["holder_count"] = row.pop("holders")
    details = inspect_json(state)
    row.update(holders=details["holders"], reservations=details["reservations"],
               waiters=details["waiters"], rate=rate,
               history=[{"t": round(at, 3), "used": used, "waiting": waiting}
                        for at, used, waiting in history])
    return row


class Dashboard:
    """Reads the state of an app's keys at most once per ``min_interval`` seconds
    (however many pages poll it) and keeps each key's history.

        dashboard = Dashboard(LockStore(app), rows=20)
        dashboard.state()["keys"][0]["used"]
    """

    def __init__(self, store: LockStore, *, rows: int = 20, history: int = 120,
                 min_interval: float = 0.5, clock: Callable[[], float] = time.monotonic,
                 refresh: float = 1.0) -> None:
        self.store = store
        self.rows = rows
        self.history = History(history)
        self.min_interval = min_interval
        self.clock = clock
        self.refresh = refresh
        self.limits = known_limits(store.app, store.prefix)
        self.rules = Rules(store.app)
        self._lock = threading.Lock()
        self._last: Optional[Tuple[float, Dict[str, Any]]] = None

    def state(self, fresh: bool = False) -> Dict[str, Any]:
        """The whole state (see ``docs/web.md`` for its fields), read anew when the last
        read is older than ``min_interval`` or ``fresh``."""
        with self._lock:
            now = self.clock()
            if fresh or self._last is None or now - self._last[0] >= self.min_interval:
                self._last = (now, self._read())
            return self._last[1]

    def _read(self) -> Dict[str, Any]:
        store = self.store
        now_ms = store.now_ms()
        states = [s for s in store.states(store.limit_keys(), now_ms, waiters=self.rows,
                                          limits=self.limits) if s.exists or s.active]
        states = sorted((s if s.configured_slots is not None else
                         replace(s, configured_slots=self.rules.slots_of(s.name))
                         for s in states), key=lambda s: s.name)
        at = now_ms / 1000
        self.history.add({s.key: (s.used, s.waiting) for s in states}, at)
        keys = []
        for state in states:
            row = key_json(state, self.rules.rate_of(state.name), self.history.of(state.key))
            row["holders"] = row["holders"][: self.rows]
            keys.append(row)
        return {
            "server_time": at,
            "prefix": store.prefix,
            "refresh_seconds": self.refresh,
            "rows": self.rows,
            "keys": keys,
            "paused": [row["name"] for row in keys if row["paused"]],
            "totals": {
                "keys": len(keys),
                "used": sum(row["used"] for row in keys),
                "waiting": sum(row["waiting"] for row in keys),
                "paused": sum(1 for row in keys if row["paused"]),
            },
        }
