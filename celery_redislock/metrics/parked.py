"""Gauges of the parked lines (``redislock_line = "broker"``), read from the lock store
and the broker at each scrape: how many runs wait, how many slots are reserved for moved
runs, references claimed and served, and the parking queues' lengths.

One series per ``limit`` label, never per waiter or per key: a key's label is the key
template of the task rule that makes its name (as the other series' ``limit``), else the
name itself within the ``redislock_metrics_max_limits`` budget (the rest under
``other``). Every worker reads the same lock store, so every exporter serves the same
values: aggregate them with ``max by (limit)``, not ``sum``.

Cost per scrape (at most once per :data:`MIN_INTERVAL`): the index of parked lines, seven
O(log n) reads per key with a parked line (one pipeline per 500 keys), and one length
per parking queue in the broker; nothing walks a line.

    collector = ParkedLinesCollector(app)
    registry.register(collector)           # the exporter does this on a broker line
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..config.settings import read_settings, redis_client
from ..engine.parked_view import ParkedLine, read_parked_lines
from ..engine.parking import parked_keys
from ..engine.scan import batches, split_key
from ..parking import ParkingQueues
from . import LabelBudget, _rule_labels, _RuleLabel, max_limit_labels_setting

logger = logging.getLogger(__name__)

#: Seconds a reading is served again before the lock store is read anew.
MIN_INTERVAL = 5.0

#: (name, help, value of a line) of each gauge; the queue's length comes apart.
GAUGES: Tuple[Tuple[str, str, Callable[[ParkedLine], int]], ...] = (
    ("parked_waiting", "Runs waiting on the parked line: references waiting and "
     "anonymous entries (parked messages counted from the broker).",
     lambda line: line.waiting),
    ("parked_reserved", "Slots reserved for runs moved out of parking, not yet claimed.",
     lambda line: line.reserved),
    ("parked_claimed", "References claimed by a holder whose run has not started "
     "(or, under acks_late, not ended).", lambda line: line.claimed),
    ("parked_served", "Served references kept (a copy given back ends unrun).",
     lambda line: line.served),
    ("parked_lines", "Keys with a parked line.", lambda line: 1),
    ("parked_fair_sub_lines", "Sub-lines (tenants) of fair limits (fair_by) with runs "
     "waiting: a count, never one series per tenant.", lambda line: line.fair_sub_lines),
)

QUEUE_GAUGE = ("parked_queue_messages",
               "Messages in the parking queues in the broker (absent when the broker "
               "could not be asked).")

Reading = Tuple[Dict[str, Dict[str, int]], Optional[Dict[str, int]], int]


class ParkedLinesCollector:
    """A ``prometheus_client`` collector of the parked lines' gauges of ``app``."""

    def __init__(self, app: Any, namespace: str = "celery_redislock") -> None:
        self.app = app
        self.namespace = namespace
        self.settings = read_settings(app)
        self.budget = LabelBudget(max_limit_labels_setting(app))
        self.queues = ParkingQueues(app)
        self._client: Any = None
        self._rules: Optional[List[_RuleLabel]] = None
        self._lock = threading.Lock()
        self._last: Optional[Tuple[float, Reading]] = None

    def label(self, key: str) -> str:
        """The ``limit`` label of semaphore ``key``."""
        if self._rules is None:
            self._rules = [rule for task in list(self.app.tasks.values())
                           for rule in _rule_labels(task)]
        split = split_key(key, self.settings.prefix)
        name = split[1] if split else key
        for rule in self._rules:
            if rule.constant == name or (rule.pattern is not None
                                         and rule.pattern.fullmatch(name)):
                return rule.label
        return self.budget.admit(name)

    def read(self) -> Reading:
        """``({gauge: {label: value}}, {label: messages} or None, up)``, read anew at
        most once per :data:`MIN_INTERVAL`."""
        with self._lock:
            now = time.monotonic()
            if self._last is None or now - self._last[0] >= MIN_INTERVAL:
                self._last = (now, self._read())
            return self._last[1]

    def _read(self) -> Reading:
        values: Dict[str, Dict[str, int]] = {name: defaultdict(int) for name, _, _ in GAUGES}
        try:
            if self._client is None:
                self._client = redis_client(self.app, self.settings)
            client = self._client
            seconds, micros = client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            lines: Dict[str, ParkedLine] = {}
            for batch in batches(parked_keys(client, self.settings.prefix), 500):
                lines.update(read_parked_lines(client, batch, now_ms))
        except Exception as exc:  # the scrape goes on with parked_up 0
            logger.warning("celery-redislock: parked lines not read: %s", exc)
            return values, None, 0
        labels = {key: self.label(key) for key in lines}
        for key, line in lines.items():
            for name, _, value in GAUGES:
                values[name][labels[key]] += value(line)
        lengths = self.queues.lengths(list(lines))
        queued: Optional[Dict[str, int]] = None
        if lengths is not None:
            queued = defaultdict(int)
            for key, length in lengths.items():
                queued[labels[key]] += length
        return values, queued, 1

    def collect(self) -> Iterator[Any]:
        """The gauges, labelled ``limit``, and ``parked_up`` (1: the lock store was read)."""
        from prometheus_client.core import GaugeMetricFamily

        values, queued, up = self.read()
        for name, help_text, _ in GAUGES:
            family = GaugeMetricFamily(f"{self.namespace}_{name}", help_text,
                                       labels=["limit"])
            for label, value in sorted(values[name].items()):
                family.add_metric([label], value)
            yield family
        family = GaugeMetricFamily(f"{self.namespace}_{QUEUE_GAUGE[0]}", QUEUE_GAUGE[1],
                                   labels=["limit"])
        for label, value in sorted((queued or {}).items()):
            family.add_metric([label], value)
        yield family
        yield GaugeMetricFamily(f"{self.namespace}_parked_up",
                                "1 if the last reading of the parked lines succeeded.",
                                value=up)


__all__ = ["GAUGES", "MIN_INTERVAL", "ParkedLinesCollector"]
