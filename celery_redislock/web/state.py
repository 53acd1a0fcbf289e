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

import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from ..admin.cli import LockStore, _constant_rules, inspect_json, known_limits, status_row
from ..admin.state import LimitState
from ..engine.keys import semaphore_key

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


def known_rates(app: Any, prefix: str) -> Dict[str, str]:
    """The rate limit (``"10/s"``) of every key that registered tasks rate-limit
    whatever their arguments: ``{semaphore key: rate}``; a key given two rates shows both.

        >>> from celery import Celery
        >>> from celery_redislock import LimitedTask
        >>> app = Celery("proj", set_as_current=False)
        >>> @app.task(base=LimitedTask, lock_rate="5/s", name="proj.ping")
        ... def ping(): ...
        >>> list(known_rates(app, "redislock:").values())
        ['5/s']
    """
    found: Dict[str, List[str]] = {}
    for name, rule in _constant_rules(app):
        if rule.rate is not None:
            rates = found.setdefault(semaphore_key(name, prefix), [])
            if str(rule.rate) not in rates:
                rates.append(str(rule.rate))
    return {key: ", ".join(rates) for key, rates in found.items()}


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
                 actions: bool = False, refresh: float = 1.0) -> None:
        self.store = store
        self.rows = rows
        self.history = History(history)
        self.min_interval = min_interval
        self.clock = clock
        self.actions = actions
        self.refresh = refresh
        self.limits = known_limits(store.app, store.prefix)
        self.rates = known_rates(store.app, store.prefix)
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
        at = now_ms / 1000
        self.history.add({s.key: (s.used, s.waiting) for s in states}, at)
        keys = []
        for state in states:
            row = key_json(state, self.rates.get(state.key), self.history.of(state.key))
            row["holders"] = row["holders"][: self.rows]
            keys.append(row)
        return {
            "server_time": at,
            "prefix": store.prefix,
            "refresh_seconds": self.refresh,
            "actions": self.actions,
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
