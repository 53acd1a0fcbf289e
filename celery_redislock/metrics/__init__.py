"""Metrics of admissions, waits and holds, fed by the package's signals.

Nothing is recorded until :func:`enable_metrics` connects receivers to the signals of
:mod:`celery_redislock.integration.signals`; until then those signals have no receivers and cost
nothing. Receivers run in the process that runs the task (a prefork pool child), so a
sink that must be read from elsewhere has to share its numbers between processes: the
Prometheus exporter (:mod:`celery_redislock.metrics.prometheus`) does.

Every series is labelled by ``task`` (the task's name) and ``limit``. The ``limit`` label
is *bounded*: by default it is the limit's key template (``"customer:{customer_id}"``),
never the key of one call (``"customer:42"``), see :func:`default_limit_label`; and a
:class:`LabelBudget` lets at most ``max_limit_labels`` distinct values through, the
others being counted under :data:`OVERFLOW`.

Example (an in-process model, for tests or for forwarding to another system)::

    from celery_redislock.metrics import MemorySink, enable_metrics

    sink = MemorySink()
    enable_metrics(app, sink=sink)
    ...  # run tasks in this process (solo or threads pool, eager runs)
    sink.value("acquisitions_total", task="proj.tasks.sync", limit="customer:{customer_id}")
    sink.histogram("hold_seconds", task="proj.tasks.sync",
                   limit="customer:{customer_id}").count

Layer: may import ``errors``, ``engine``, ``config`` and ``integration`` (the signals it
listens to, and which tasks are limited). ``prometheus`` is the Prometheus exporter.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import re
import string
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import LockConfigurationError
from ..run import signals
from ..run.limited import limits_of
from .fair import QUANTILES, TenantWaits, quantile_label

logger = logging.getLogger(__name__)

#: The ``limit`` label of values past the budget of :class:`LabelBudget`.
OVERFLOW = "other"

#: The ``limit`` label of a run sent back because the lock store could not be reached.
UNREACHABLE = "lock_store_unreachable"

#: Longest ``limit`` label value; longer ones are cut.
MAX_LABEL_LENGTH = 120

DEFAULT_MAX_LIMIT_LABELS = 100

LimitLabel = Callable[[Any, Optional[str]], str]


@dataclass(frozen=True)
class MetricSpec:
    """One series family: its name (without prefix), kind, help text, label names, buckets."""

    name: str
    kind: str  # "counter", "histogram" or "gauge"
    help: str
    labels: Tuple[str, ...] = ("task", "limit")
    buckets: Tuple[float, ...] = ()
    #: How the Prometheus exporter adds up a gauge across a worker's processes.
    mode: str = "livesum"


WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                600.0, 1800.0, 3600.0)
HOLD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0, 600.0, 1800.0, 3600.0)
COUNTDOWN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
                     1800.0)

ACQUISITIONS = MetricSpec("acquisitions_total", "counter",
                          "Runs admitted past every limit of their task.")
CONTENTIONS = MetricSpec("contentions_total", "counter",
                         "Runs refused by a concurrency limit (or because the lock store "
                         "could not be reached) and sent back to the queue.")
RATE_LIMITED = MetricSpec("rate_limited_total", "counter",
                          "Runs refused by a rate limit and sent back to the queue.")
LEASES_LOST = MetricSpec("leases_lost_total", "counter",
                         "Leases found gone while their run still ran.")
WAIT = MetricSpec("wait_seconds", "histogram",
                  "Time from a run's first refusal to its admission (0 if never refused).",
                  buckets=WAIT_BUCKETS)
HOLD = MetricSpec("hold_seconds", "histogram", "Time a run held its slots.",
                  buckets=HOLD_BUCKETS)
COUNTDOWN = MetricSpec("countdown_seconds", "histogram",
                       "Countdown given to a refused run sent back to the queue; cause is "
                       "slots, rate, paused or unreachable.",
                       labels=("task", "limit", "cause"), buckets=COUNTDOWN_BUCKETS)
HOLDING = MetricSpec("holding", "gauge", "Runs holding their slots now.")
STORE_ERRORS = MetricSpec("lock_store_errors_total", "counter",
                          "Calls the lock store refused or failed, by kind (full, readonly, "
                          "loading, auth, permission, unknown_command, script).",
                          labels=("task", "kind"))

FAIR_WAIT = MetricSpec("fair_wait_seconds", "histogram",
                       "Time from a run's first refusal to its admission, for runs under a "
                       "limit with fair_by (labelled by the limit, never the tenant).",
                       buckets=WAIT_BUCKETS)
FAIR_TENANT_WAIT = MetricSpec("fair_tenant_wait_seconds", "gauge",
                              "Quantiles across the recently admitted tenants of a fair "
                              "limit of each tenant's recent mean wait (max over live "
                              "processes).", labels=("task", "limit", "quantile"),
                              mode="livemax")

#: Every metric recorded, in the order they are documented.
METRICS: Tuple[MetricSpec, ...] = (ACQUISITIONS, CONTENTIONS, RATE_LIMITED, LEASES_LOST,
                                   WAIT, HOLD, COUNTDOWN, HOLDING, STORE_ERRORS, FAIR_WAIT,
                                   FAIR_TENANT_WAIT)


# --- where the numbers go -------------------------------------------------------------


class Sink:
    """Where a :class:`MetricsRecorder` puts numbers. Subclass and override both methods.

    ``labels`` holds a value for every name of ``metric.labels``. ``inc`` serves counters
    and gauges (a gauge may be given a negative amount); ``observe`` serves histograms.
    """

    def inc(self, metric: MetricSpec, labels: Mapping[str, str], amount: float = 1.0) -> None:
        raise NotImplementedError

    def observe(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        raise NotImplementedError

    def set(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        """Set a gauge to ``value`` (the fair limits' quantiles); by default not kept."""


@dataclass
class HistogramValue:
    """Observations of one histogram series: count, sum and cumulative bucket counts."""

    bounds: Tuple[float, ...]
    count: int = 0
    sum: float = 0.0
    buckets: List[int] = field(default_factory=list)

    def add(self, value: float) -> None:
        if not self.buckets:
            self.buckets = [0] * len(self.bounds)
        self.count += 1
        self.sum += value
        for index in range(bisect.bisect_left(self.bounds, value), len(self.bounds)):
            self.buckets[index] += 1


class MemorySink(Sink):
    """The numbers of this process, in memory: the package's in-process metrics model.

    Example::

        sink = MemorySink()
        enable_metrics(app, sink=sink)
        ...
        sink.value("contentions_total", task="proj.sync", limit="customer:{customer_id}")
        sink.snapshot()["acquisitions_total"]   # {(("limit", ...), ("task", ...)): 3.0}
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Dict[str, Dict[Tuple[Tuple[str, str], ...], float]] = {}
        self._histograms: Dict[str, Dict[Tuple[Tuple[str, str], ...], HistogramValue]] = {}

    def inc(self, metric: MetricSpec, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values.setdefault(metric.name, {})
            series[key] = series.get(key, 0.0) + amount

    def observe(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._histograms.setdefault(metric.name, {})
            series.setdefault(key, HistogramValue(metric.buckets)).add(value)

    def set(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values.setdefault(metric.name, {})[key] = value

    def value(self, name: str, **labels: str) -> float:
        """A counter's or gauge's value for ``labels`` (0 if never recorded)."""
        with self._lock:
            return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def histogram(self, name: str, **labels: str) -> HistogramValue:
        """A histogram series for ``labels`` (empty if never recorded)."""
        bounds = next((m.buckets for m in METRICS if m.name == name), ())
        with self._lock:
            found = self._histograms.get(name, {}).get(tuple(sorted(labels.items())))
            return found if found is not None else HistogramValue(bounds)

    def snapshot(self) -> Dict[str, Dict[Tuple[Tuple[str, str], ...], Any]]:
        """Every series: metric name -> sorted label pairs -> value or HistogramValue."""
        with self._lock:
            copy: Dict[str, Dict[Tuple[Tuple[str, str], ...], Any]] = {
                name: dict(series) for name, series in self._values.items()
            }
            for name, histograms in self._histograms.items():
                copy[name] = {key: HistogramValue(h.bounds, h.count, h.sum, list(h.buckets))
                              for key, h in histograms.items()}
            return copy


# --- bounded labels -------------------------------------------------------------------


class LabelBudget:
    """Lets at most ``cap`` distinct label values through, :data:`OVERFLOW` included:
    the first ``cap - 1`` values seen keep their name, later ones become ``OVERFLOW``.

    This one counts within one process; :class:`SharedLabelBudget` counts across the
    processes of a machine. Memory stays bounded: values past the budget are not kept.

    Example::

        budget = LabelBudget(3)
        [budget.admit(v) for v in ("a", "b", "c", "a")]   # ['a', 'b', 'other', 'a']
    """

    def __init__(self, cap: int) -> None:
        self.cap = check_cap(cap)
        self._admitted: Set[str] = set()
        self._full = cap <= 1
        self._lock = threading.Lock()

    def admit(self, value: str) -> str:
        """``value`` if it is within the budget, else :data:`OVERFLOW`."""
        if value in self._admitted:
            return value
        if self._full or value == OVERFLOW:
            return OVERFLOW
        with self._lock:
            if value in self._admitted:
                return value
            if self._full:
                return OVERFLOW
            return value if self._claim(value) else OVERFLOW

    def _claim(self, value: str) -> bool:
        """Admit a value not seen yet, if the budget allows; called under the lock."""
        if len(self._admitted) >= self.cap - 1:
            self._full = True
            return False
        self._admitted.add(value)
        return True


class SharedLabelBudget(LabelBudget):
    """A :class:`LabelBudget` shared by every process that names the same ``path``: the
    admitted values are kept in that file, one a line, under an exclusive ``flock``.

    A process reads the file once per value it has not seen yet, and not at all once the
    budget is spent.

    Example::

        budget = SharedLabelBudget("/run/metrics/limit_labels.txt", cap=50)
        budget.admit("customer:{customer_id}")
    """

    def __init__(self, path: str, cap: int) -> None:
        super().__init__(cap)
        self.path = path

    def _claim(self, value: str) -> bool:
        import fcntl

        with open(self.path, "a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.seek(0)
                self._admitted.update(line.rstrip("\n") for line in handle)
                if value in self._admitted:
                    return True
                if len(self._admitted) >= self.cap - 1:
                    self._full = True
                    return False
                handle.write(value + "\n")
                handle.flush()
                self._admitted.add(value)
                return True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def check_cap(cap: Any) -> int:
    """``cap`` if it is a valid ``max_limit_labels`` (an int of at least 1), else raise."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise LockConfigurationError(
            f"setting redislock_metrics_max_limits must be a whole number of at least 1 "
            f"(the most distinct values of the limit label), not {cap!r}"
        )
    return cap


# --- the default limit label ----------------------------------------------------------


@dataclass(frozen=True)
class _RuleLabel:
    label: str
    constant: Optional[str]  # the key of a rule whose key never changes
    pattern: Optional[re.Pattern]  # matches the keys a template rule builds


def _rule_labels(task: Any) -> List[_RuleLabel]:
    limits = limits_of(task)
    if limits is None:
        return []
    labels = []
    for rule in limits.rules:
        source = rule.key.source
        if source is None:
            name = rule.key.render((), {})
            labels.append(_RuleLabel(name, name, None))
        elif callable(source):
            name = getattr(source, "__qualname__", None) or type(source).__name__
            labels.append(_RuleLabel(f"{name}()", None, None))
        else:
            labels.append(_RuleLabel(source, None, _template_pattern(source)))
    return labels


def _template_pattern(template: str) -> Optional[re.Pattern]:
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return None
    regex = "".join(re.escape(text) + ("(.*?)" if field is not None else "")
                    for text, field, _, _ in parts)
    return re.compile(regex, re.DOTALL)


def _label_of_name(rules: Sequence[_RuleLabel], name: str) -> Optional[str]:
    for rule in rules:
        if rule.constant == name:
            return rule.label
    variable = [rule for rule in rules if rule.constant is None]
    if len(variable) == 1:
        return variable[0].label
    for rule in variable:
        if rule.pattern is not None and rule.pattern.fullmatch(name):
            return rule.label
    return next((rule.label for rule in variable if rule.pattern is None), None)


def default_limit_label(task: Any, key: Optional[str]) -> str:
    """The ``limit`` label of ``key`` for ``task``: the limit's key *template*, so that
    per-argument keys collapse into one series per limit.

    ``key`` is a limit's key (``"customer:42"``), several joined by ``", "`` (the slots a
    run holds), ``""`` (a run admitted by rate limits alone: the label of all its limits)
    or None (the lock store could not be reached: :data:`UNREACHABLE`).

    ==========================================  ==========================================
    the task's ``lock_key``                     label
    ==========================================  ==========================================
    none (the key is the task's name)           the task's name
    ``"customer:{customer_id}"``                ``"customer:{customer_id}"``
    a function ``customer_key``                 ``"customer_key()"``
    ==========================================  ==========================================

    Wrap it to label some limits otherwise (mind the cardinality)::

        def limit_label(task, key):
            if task.name == "proj.tasks.call_api":
                return key.split(":")[0]           # "token:abc" -> "token"
            return default_limit_label(task, key)
    """
    if key is None:
        return UNREACHABLE
    rules = getattr(task, "__dict__", {}).get("_redislock_metric_rules")
    if rules is None:
        rules = _rule_labels(task)
        with contextlib.suppress(AttributeError, TypeError):
            task.__dict__["_redislock_metric_rules"] = rules
    if not rules:
        return key or getattr(task, "name", "") or OVERFLOW
    names = key.split(", ") if key else []
    found = [_label_of_name(rules, name) for name in names] if names else [
        rule.label for rule in rules]
    labels = list(dict.fromkeys(label for label in found if label))
    return ", ".join(labels) if labels else OVERFLOW


# --- the recorder ---------------------------------------------------------------------


class MetricsRecorder:
    """Turns the package's signals into numbers in ``sink``.

    ``app``: only tasks of this app are recorded (None: every task). ``limit_label``
    makes the ``limit`` label of a key (default :func:`default_limit_label`); its values
    pass through ``budget``. Made and connected by :func:`enable_metrics`.
    """

    def __init__(self, sink: Sink, *, app: Any = None, limit_label: Optional[LimitLabel] = None,
                 budget: Optional[LabelBudget] = None) -> None:
        self.sink = sink
        self.app = app
        self.limit_label = limit_label or default_limit_label
        self.budget = budget or LabelBudget(DEFAULT_MAX_LIMIT_LABELS)
        self._receivers: List[Tuple[Any, Callable[..., None]]] = [
            (signals.lock_acquired, self.on_acquired),
            (signals.lock_released, self.on_released),
            (signals.lock_contended, self.on_contended),
            (signals.rate_limited, self.on_rate_limited),
            (signals.lease_lost, self.on_lease_lost),
            (signals.lock_store_error, self.on_lock_store_error),
        ]
        self._label_failed = False
        #: Per (task, limit label) of a fair limit: its tenants' recent mean waits.
        self.tenant_waits: Dict[Tuple[str, str], TenantWaits] = {}

    def connect(self) -> MetricsRecorder:
        """Start recording (connect the receivers). Returns itself."""
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)
        return self

    def disconnect(self) -> None:
        """Stop recording."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)

    def labels(self, task: Any, key: Optional[str]) -> Dict[str, str]:
        """The ``task`` and bounded ``limit`` labels of ``key`` for ``task``."""
        try:
            label = str(self.limit_label(task, key)).replace("\n", " ")[:MAX_LABEL_LENGTH]
        except Exception:
            if not self._label_failed:
                self._label_failed = True
                logger.exception("celery-redislock: the metrics limit_label function failed "
                                 "for task %s, key %r; counting it as %r",
                                 getattr(task, "name", task), key, OVERFLOW)
            label = OVERFLOW
        return {"task": str(getattr(task, "name", "") or ""), "limit": self.budget.admit(label)}

    def _mine(self, task: Any) -> bool:
        if task is None:
            return False
        if self.app is None:
            return True
        get_app = getattr(task, "_get_app", None)
        app = get_app() if callable(get_app) else getattr(task, "app", None)
        return app is self.app

    def on_acquired(self, sender: Any = None, lease: Any = None, waited: float = 0.0,
                    **_: Any) -> None:
        if not self._mine(sender):
            return
        labels = self.labels(sender, getattr(lease, "name", ""))
        self.sink.inc(ACQUISITIONS, labels)
        self.sink.observe(WAIT, labels, max(0.0, float(waited or 0.0)))
        if _holds_slots(lease):
            self.sink.inc(HOLDING, labels)
        self._fair_waits(sender, max(0.0, float(waited or 0.0)))

    def _fair_waits(self, task: Any, waited: float) -> None:
        """For each limit of ``task`` with ``fair_by``: ``waited`` into its histogram,
        and into its tenant's recent mean, then that limit's quantiles across tenants
        (bounded: :mod:`.fair`). The tenant is the key ``fair_by`` renders from the
        run's arguments (``task.request``)."""
        try:
            limits = limits_of(task)
        except Exception:
            return
        fair_rules = [(rule, rule.fair_by) for rule in (limits.rules if limits else ())
                      if rule.fair_by is not None]
        if not fair_rules:
            return
        request = getattr(task, "request", None)
        args = getattr(request, "args", None) or ()
        kwargs = getattr(request, "kwargs", None) or {}
        for rule, fair_by in fair_rules:
            try:
                name, tenant = rule.key.render(args, kwargs), fair_by.render(args, kwargs)
            except Exception:
                continue
            labels = self.labels(task, name)
            self.sink.observe(FAIR_WAIT, labels, waited)
            waits = self.tenant_waits.setdefault((labels["task"], labels["limit"]),
                                                 TenantWaits())
            waits.add(tenant, waited)
            for q, value in waits.quantiles(QUANTILES).items():
                self.sink.set(FAIR_TENANT_WAIT, {**labels, "quantile": quantile_label(q)},
                              value)

    def on_released(self, sender: Any = None, lease: Any = None, held: float = 0.0,
                    **_: Any) -> None:
        if not self._mine(sender):
            return
        labels = self.labels(sender, getattr(lease, "name", ""))
        self.sink.observe(HOLD, labels, max(0.0, float(held or 0.0)))
        self.sink.inc(HOLDING, labels, -1.0)

    def on_contended(self, sender: Any = None, key: Optional[str] = None,
                     countdown: float = 0.0, reason: str = "", **_: Any) -> None:
        if not self._mine(sender):
            return
        labels = self.labels(sender, key)
        self.sink.inc(CONTENTIONS, labels)
        if key is None:
            cause = "unreachable"
        else:
            cause = "paused" if str(reason or "").endswith("paused") else "slots"
        self.sink.observe(COUNTDOWN, {**labels, "cause": cause}, float(countdown or 0.0))

    def on_rate_limited(self, sender: Any = None, key: Optional[str] = None,
                        countdown: float = 0.0, **_: Any) -> None:
        if not self._mine(sender):
            return
        labels = self.labels(sender, key)
        self.sink.inc(RATE_LIMITED, labels)
        self.sink.observe(COUNTDOWN, {**labels, "cause": "rate"}, float(countdown or 0.0))

    def on_lease_lost(self, sender: Any = None, lease: Any = None, **_: Any) -> None:
        if not self._mine(sender):
            return
        self.sink.inc(LEASES_LOST, self.labels(sender, getattr(lease, "name", "")))


    def on_lock_store_error(self, sender: Any = None, kind: str = "", **_: Any) -> None:
        is_app = hasattr(sender, "send_task")  # no task concerned: the app sent it
        if not (self.app in (None, sender) if is_app else self._mine(sender)):
            return
        task = "" if is_app else str(getattr(sender, "name", "") or "")
        self.sink.inc(STORE_ERRORS, {"task": task, "kind": str(kind or "")})


def _holds_slots(lease: Any) -> bool:
    holds = getattr(lease, "holds_slots", True)
    return bool(holds)


# --- entry point ----------------------------------------------------------------------


def limit_label_setting(app: Any) -> Optional[LimitLabel]:
    """The ``redislock_metrics_limit_label`` setting: a callable, a ``"module:function"``
    or ``"module.function"`` path, or None."""
    value = app.conf.get("redislock_metrics_limit_label")
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        from importlib import import_module

        module, _, name = value.rpartition(":") if ":" in value else value.rpartition(".")
        try:
            found = getattr(import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise LockConfigurationError(
                f"setting redislock_metrics_limit_label: cannot import {value!r}: {exc}"
            ) from exc
        if callable(found):
            return found
    raise LockConfigurationError(
        f"setting redislock_metrics_limit_label must be a function (task, key) -> str or "
        f"the import path of one, not {value!r}"
    )


def max_limit_labels_setting(app: Any) -> int:
    """The ``redislock_metrics_max_limits`` setting (default 100), checked."""
    return check_cap(app.conf.get("redislock_metrics_max_limits", DEFAULT_MAX_LIMIT_LABELS))


def enable_metrics(app: Any = None, *, sink: Optional[Sink] = None,
                   limit_label: Optional[LimitLabel] = None,
                   max_limit_labels: Optional[int] = None,
                   budget: Optional[LabelBudget] = None) -> MetricsRecorder:
    """Record metrics of ``app``'s limited tasks in ``sink`` (default a new
    :class:`MemorySink`), in this process and the processes it forks from now on.

    ``limit_label`` and ``max_limit_labels`` default to the app settings
    ``redislock_metrics_limit_label`` and ``redislock_metrics_max_limits`` (100).
    Calling it again for the same app without a ``sink`` returns the recorder it made;
    with a ``sink``, the earlier recorder is disconnected first.

    Example::

        recorder = enable_metrics(app)
        ...
        recorder.sink.value("acquisitions_total", task="proj.tasks.crawl",
                            limit="proj.tasks.crawl")
        disable_metrics(app)
    """
    holder = app if app is not None else _global
    existing = getattr(holder, "_redislock_metrics", None)
    if existing is not None:
        if sink is None:
            return existing
        existing.disconnect()
    if app is not None:
        limit_label = limit_label or limit_label_setting(app)
        if max_limit_labels is None:
            max_limit_labels = max_limit_labels_setting(app)
    cap = check_cap(max_limit_labels if max_limit_labels is not None
                    else DEFAULT_MAX_LIMIT_LABELS)
    recorder = MetricsRecorder(sink or MemorySink(), app=app, limit_label=limit_label,
                               budget=budget or LabelBudget(cap))
    holder._redislock_metrics = recorder
    return recorder.connect()


def disable_metrics(app: Any = None) -> None:
    """Stop recording what :func:`enable_metrics` started for ``app``; harmless if it
    never did."""
    holder = app if app is not None else _global
    recorder = getattr(holder, "_redislock_metrics", None)
    if recorder is not None:
        recorder.disconnect()
        holder._redislock_metrics = None


def metrics_recorder(app: Any = None) -> Optional[MetricsRecorder]:
    """The recorder :func:`enable_metrics` made for ``app``, or None."""
    return getattr(app if app is not None else _global, "_redislock_metrics", None)


class _Global:
    _redislock_metrics: Optional[MetricsRecorder] = None


_global = _Global()
