"""A Prometheus exporter for the package's metrics, served by each worker's main process.

Needs the ``prometheus`` extra (``pip install 'celery-redislock[prometheus]'``). In the
module that makes the app::

    from celery_redislock.metrics.prometheus import enable_prometheus

    app.conf.redislock_metrics_port = 9809
    enable_prometheus(app)

Every ``celery worker`` of the app then serves ``http://<host>:9809/metrics``. Several
workers on one machine each need a port: give a range, ``"9809-9818"``, and each worker
serves the first free port of it and logs which.

How it works. The signals that feed the metrics are sent where tasks run: in the pool's
child processes under prefork. So the metrics use ``prometheus_client``'s multiprocess
mode: each process writes its numbers to files of its own in a directory, and the
exporter, in the worker's main process, adds them up at each scrape. The directory is
``PROMETHEUS_MULTIPROC_DIR`` if set (it should then be emptied before the worker starts,
and belong to this worker alone), else a fresh temporary directory made when the worker
starts and removed when it exits. The ``holding`` gauge counts live processes only: the
files of a pool child that died are dropped (``mark_process_dead``) at the next scrape,
and a new child whose process id was used before starts from clean files.

=================================  =======================================================
``redislock_metrics_port``         port of the exporter (required), or a range
                                   ``"9809-9818"`` of which each worker takes the first
                                   free port; 0: any free port. The worker logs its port
``redislock_metrics_addr``         address it listens on (default ``"0.0.0.0"``)
``redislock_metrics_max_limits``   at most this many distinct values of the ``limit``
                                   label, ``"other"`` included (default 100)
``redislock_metrics_limit_label``  function ``(task, key) -> str`` making the ``limit``
                                   label (default :func:`~.metrics.default_limit_label`)
=================================  =======================================================
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from celery import bootsteps
from celery.signals import worker_process_init

from ..errors import LockConfigurationError
from ..gate.recovery import process_alive
from . import (
    METRICS,
    MetricSpec,
    SharedLabelBudget,
    Sink,
    enable_metrics,
    limit_label_setting,
    max_limit_labels_setting,
)
from .parked import ParkedLinesCollector

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, multiprocess, values
except ImportError:  # pragma: no cover - the extra is not installed
    prometheus_client = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

NAMESPACE = "celery_redislock"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LABELS_FILE = "redislock_limit_labels.txt"
DEFAULT_ADDR = "0.0.0.0"

_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db$")


def _require_client() -> None:
    if prometheus_client is None:
        raise ImportError(
            "celery_redislock.metrics.prometheus needs prometheus-client: "
            "pip install 'celery-redislock[prometheus]'"
        )


def enable_prometheus(app: Any, *, port: Optional[int] = None,
                      addr: Optional[str] = None) -> None:
    """Make every worker of ``app`` record the package's metrics and serve them for
    Prometheus on ``port`` (default: the ``redislock_metrics_port`` setting).

    Example::

        app.conf.redislock_metrics_port = 9809
        enable_prometheus(app)

    Only ``celery worker`` processes are affected; calling it twice is harmless.
    """
    _require_client()
    app._redislock_prometheus = {"port": port, "addr": addr}
    app.steps["worker"].add(PrometheusExporterStep)


def exporter_options(app: Any) -> Tuple[Tuple[int, ...], str]:
    """The exporter's ports (tried in order; the first free one is served) and address
    for ``app``, checked."""
    overrides: Mapping[str, Any] = getattr(app, "_redislock_prometheus", None) or {}
    port = overrides.get("port")
    if port is None:
        port = app.conf.get("redislock_metrics_port")
    addr = overrides.get("addr") or app.conf.get("redislock_metrics_addr") or DEFAULT_ADDR
    if port is None:
        raise LockConfigurationError(
            "celery-redislock Prometheus exporter: set redislock_metrics_port (a port, a "
            "range such as '9809-9818' for several workers on one machine, or 0 for any "
            "free port) or pass port= to enable_prometheus()"
        )
    if not isinstance(addr, str):
        raise LockConfigurationError(
            f"setting redislock_metrics_addr must be a host or address, not {addr!r}"
        )
    return port_range(port), addr


def port_range(port: Any) -> Tuple[int, ...]:
    """The ports a ``redislock_metrics_port`` value names: a port, or a range ``"A-B"``
    (both ends included) of which each worker serves the first free one.

        >>> port_range(9809), port_range("9809-9811")
        ((9809,), (9809, 9810, 9811))
    """
    text = port.strip() if isinstance(port, str) else None
    if text is not None and "-" in text:
        low, _, high = (part.strip() for part in text.partition("-"))
        if low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) <= 65535:
            return tuple(range(int(low), int(high) + 1))
    elif text is not None and text.isdigit():
        port = int(text)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise LockConfigurationError(
            "setting redislock_metrics_port must be a port number (0 to 65535) or a range "
            f"of them such as '9809-9818', not {port!r}"
        )
    return (port,)


class PrometheusSink(Sink):
    """Puts the numbers of :data:`~celery_redislock.metrics.METRICS` in ``prometheus_client``
    metrics named ``celery_redislock_<name>``, not registered in any registry (in
    multiprocess mode, they are read back from their files).

    Example::

        sink = PrometheusSink()
        enable_metrics(app, sink=sink)
    """

    def __init__(self, namespace: str = NAMESPACE) -> None:
        _require_client()
        self.metrics: Dict[str, Any] = {spec.name: _make(spec, namespace) for spec in METRICS}

    def inc(self, metric: MetricSpec, labels: Mapping[str, str], amount: float = 1.0) -> None:
        series = self.metrics[metric.name].labels(**labels)
        if metric.kind == "gauge" or amount > 0:
            series.inc(amount)

    def observe(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        self.metrics[metric.name].labels(**labels).observe(value)

    def set(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        self.metrics[metric.name].labels(**labels).set(value)


def _make(spec: MetricSpec, namespace: str) -> Any:
    common: Dict[str, Any] = {"namespace": namespace, "registry": None}
    if spec.kind == "counter":
        return prometheus_client.Counter(spec.name, spec.help, spec.labels, **common)
    if spec.kind == "histogram":
        return prometheus_client.Histogram(spec.name, spec.help, spec.labels,
                                           buckets=spec.buckets, **common)
    return prometheus_client.Gauge(spec.name, spec.help, spec.labels,
                                   multiprocess_mode=spec.mode,  # type: ignore[arg-type]
                                   **common)


_Collector: Any = multiprocess.MultiProcessCollector if prometheus_client else object


class SweepingCollector(_Collector):
    """``MultiProcessCollector`` that first drops the live-gauge files of processes that
    have exited (a pool child killed, or replaced after ``max_tasks_per_child``)."""

    def __init__(self, registry: Any, path: str) -> None:
        self.directory = path
        super().__init__(registry, path=path)

    def collect(self) -> Any:
        sweep_dead_processes(self.directory)
        return super().collect()


def sweep_dead_processes(path: str) -> int:
    """``mark_process_dead`` for each process with live-gauge files in ``path`` that no
    longer runs. Returns how many were swept."""
    dead = set()
    for name in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        match = _LIVE_GAUGE_FILE.search(name)
        if match and not process_alive(int(match.group(1))):
            dead.add(int(match.group(1)))
    for pid in dead:
        multiprocess.mark_process_dead(pid, path)
    return len(dead)


class Exporter:
    """The exporter of one worker: prepared in the main process before the pool forks
    (:meth:`prepare`), serving HTTP while the worker runs (:meth:`start`, :meth:`stop`)."""

    def __init__(self, app: Any, ports: Sequence[int], addr: str) -> None:
        self.app = app
        self.ports = tuple(ports)
        self.addr = addr
        self.path = ""
        self.own_directory = False
        self.server: Any = None

    def prepare(self) -> None:
        """Choose the multiprocess directory, switch ``prometheus_client`` to multiprocess
        mode, and connect the metrics' receivers (which pool children inherit)."""
        path = os.environ.get(MULTIPROC_ENV)
        if path:
            os.makedirs(path, exist_ok=True)
        else:
            path = tempfile.mkdtemp(prefix="celery-redislock-metrics-")
            os.environ[MULTIPROC_ENV] = path  # pool children inherit it
            self.own_directory = True
            atexit.register(_remove_directory, path, os.getpid())
        self.path = path
        if not getattr(values.ValueClass, "_multiprocess", False):
            # prometheus_client chose its value class when imported, before the variable
            # was set: metrics made from now on write to the directory.
            values.ValueClass = values.MultiProcessValue()
        budget = SharedLabelBudget(os.path.join(path, LABELS_FILE),
                                   max_limit_labels_setting(self.app))
        enable_metrics(self.app, sink=PrometheusSink(), budget=budget,
                       limit_label=limit_label_setting(self.app))
        _directories[os.getpid()] = path

    def start(self) -> None:
        """Serve ``/metrics`` on the first port of :attr:`ports` that can be bound (the
        others being taken, e.g. by other workers on the machine); none that can is
        logged, not fatal."""
        registry = CollectorRegistry()
        SweepingCollector(registry, path=self.path)
        registry.register(ParkedLinesCollector(self.app))
        error: Optional[OSError] = None
        for port in self.ports:
            try:
                started = prometheus_client.start_http_server(port, self.addr, registry)
            except OSError as exc:
                error = exc
                continue
            self.server = started[0] if isinstance(started, tuple) else None
            served = self.server.server_port if self.server is not None else port
            logger.info("celery-redislock: Prometheus metrics on http://%s:%d/metrics "
                        "(from %s)", self.addr, served, self.path)
            return
        logger.error("celery-redislock: could not serve Prometheus metrics on %s:%s: %s%s",
                     self.addr, _shown(self.ports), error,
                     "" if len(self.ports) > 1 else
                     " (several workers on one machine: give redislock_metrics_port a range "
                     "such as '9809-9818')")

    def stop(self) -> None:
        """Stop serving."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _shown(ports: Sequence[int]) -> str:
    return str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]} (all taken)"


_directories: Dict[int, str] = {}


@worker_process_init.connect(weak=False)
def _clean_reused_pid(**_: Any) -> None:
    """A new pool child whose process id an earlier process had starts with no live
    gauge left by that process."""
    path = next(iter(_directories.values()), None)
    if path and prometheus_client is not None:
        multiprocess.mark_process_dead(os.getpid(), path)


def _remove_directory(path: str, main_pid: int) -> None:
    if os.getpid() == main_pid:
        shutil.rmtree(path, ignore_errors=True)


class PrometheusExporterStep(bootsteps.StartStopStep):
    """Worker bootstep: prepares the exporter before the pool starts, serves while the
    worker runs."""

    name = "celery_redislock.metrics.prometheus"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        ports, addr = exporter_options(worker.app)
        self.exporter = Exporter(worker.app, ports, addr)
        self.exporter.prepare()
        super().__init__(worker, **kwargs)

    def create(self, worker: Any) -> Exporter:
        return self.exporter
