"""Signals, metrics and the Prometheus exporter, from real prefork workers.

Each test starts one ``celery worker -P prefork -c 2`` of :mod:`metrics_app` on a private
Redis server, runs limited tasks on it, and checks what the exporter in the worker's main
process serves over HTTP (the numbers are recorded in the two pool children), or what
the signal receivers connected in the worker recorded.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import urllib.request
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, List, Set, Tuple

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_redislock import LimitedTask, LockConfigurationError
from celery_redislock.engine.keys import semaphore_key
from celery_redislock.integration import signals
from celery_redislock.metrics import (
    OVERFLOW,
    LabelBudget,
    MemorySink,
    MetricsRecorder,
    disable_metrics,
    enable_metrics,
)
from celery_redislock.metrics.prometheus import Exporter, exporter_options

import metrics_app
from cluster_checks import lock_store, record_store, wait_for_results, wait_until
from metrics_app import (
    CONTENDED,
    MAX_LIMIT_LABELS,
    PER_CUSTOMER,
    RATED,
    SHORT_LEASE,
    TEMPLATED,
)

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow

Samples = Dict[str, List[Tuple[Dict[str, str], float]]]

#: The kwargs of each signal, as signals.py documents them.
DOCUMENTED_KWARGS = {
    "lock_acquired": ["lease", "task_id", "waited"],
    "lock_contended": ["countdown", "key", "reason", "task_id"],
    "rate_limited": ["countdown", "key", "promise", "task_id"],
    "lock_released": ["held", "lease", "task_id"],
    "lease_lost": ["lease", "task_id"],
}


@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory) -> WorkerCluster:
    """One worker of :mod:`metrics_app` with two prefork children."""
    return worker_cluster_factory(app_module="metrics_app", app_factory=metrics_app.create_app,
                                  workers=1, concurrency=2)


def exporter(cluster: WorkerCluster) -> str:
    """The URL the worker's exporter serves, from its log."""
    found: List[str] = []

    def logged() -> bool:
        url = metrics_app.exporter_url(cluster.logs())
        if url:
            found.append(url)
        return bool(url)

    wait_until(logged, 20, "the worker to log its exporter's URL")
    return found[0]


def scrape(url: str) -> Samples:
    """Every sample the exporter serves: name -> [(labels, value)]."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(value for found, value in samples.get(name, [])
               if all(found.get(k) == v for k, v in labels.items()))


def limit_labels(samples: Samples, name: str, task: str) -> Set[str]:
    return {found["limit"] for found, _ in samples.get(name, []) if found.get("task") == task}


def test_metrics_from_a_real_prefork_worker(cluster: WorkerCluster) -> None:
    """Counts and histograms recorded in two pool children, scraped from the exporter
    of the main process, match what ran; 50 per-customer labels stay within the cap."""
    url = exporter(cluster)
    app = cluster.app
    contended = [app.tasks[CONTENDED].delay(0.15) for _ in range(6)]
    rated = [app.tasks[RATED].delay() for _ in range(4)]
    wait_for_results(cluster, contended + rated)
    # The templated task comes first, so that the per-customer labels do not spend the
    # whole budget before it has its label.
    wait_for_results(cluster, [app.tasks[TEMPLATED].delay(i) for i in range(50)])
    wait_for_results(cluster, [app.tasks[PER_CUSTOMER].delay(i) for i in range(50)])

    samples = scrape(url)
    c = CONTENDED
    acquisitions = "celery_redislock_acquisitions_total"
    assert total(samples, acquisitions, task=c) == 6
    assert total(samples, "celery_redislock_hold_seconds_count", task=c) == 6
    assert total(samples, "celery_redislock_hold_seconds_sum", task=c) >= 6 * 0.15
    assert total(samples, "celery_redislock_wait_seconds_count", task=c) == 6
    assert total(samples, "celery_redislock_wait_seconds_sum", task=c) > 0
    contentions = total(samples, "celery_redislock_contentions_total", task=c)
    assert contentions >= 1
    assert total(samples, "celery_redislock_countdown_seconds_count", task=c,
                 cause="slots") == contentions
    assert limit_labels(samples, acquisitions, c) == {c}

    assert total(samples, acquisitions, task=RATED) == 4
    assert total(samples, "celery_redislock_rate_limited_total", task=RATED) >= 1
    assert total(samples, "celery_redislock_countdown_seconds_count", task=RATED,
                 cause="rate") == total(samples, "celery_redislock_rate_limited_total",
                                        task=RATED)
    assert total(samples, "celery_redislock_hold_seconds_count", task=RATED) == 0

    assert total(samples, acquisitions, task=TEMPLATED) == 50
    assert limit_labels(samples, acquisitions, TEMPLATED) == {"customer:{customer_id}"}
    assert total(samples, acquisitions, task=PER_CUSTOMER) == 50
    assert total(samples, "celery_redislock_hold_seconds_count", task=PER_CUSTOMER) == 50
    every_label = {found["limit"] for found, _ in samples[acquisitions]}
    assert len(every_label) <= MAX_LIMIT_LABELS, every_label
    assert OVERFLOW in limit_labels(samples, acquisitions, PER_CUSTOMER)

    assert total(samples, "celery_redislock_holding") == 0
    assert total(samples, "celery_redislock_leases_lost_total") == 0
    assert total(samples, acquisitions) == 6 + 4 + 50 + 50
    pids = record_store(cluster).smembers("pids")
    assert len(pids) == 2, f"the tasks ran in {len(pids)} pool process(es), not both"


def test_a_fair_limits_waits_by_tenant_from_a_real_prefork_worker(
        cluster: WorkerCluster) -> None:
    """Runs of a limit with ``fair_by`` in two pool children: every wait is in the
    limit's histogram, and the tenants' quantiles are four series, not one per tenant."""
    url = exporter(cluster)
    fair = cluster.app.tasks[metrics_app.FAIR]
    wait_for_results(cluster, [fair.delay(f"t{n % 5}", 0.1) for n in range(10)])
    samples = scrape(url)
    labels = {"task": metrics_app.FAIR, "limit": metrics_app.FAIR}
    assert total(samples, "celery_redislock_fair_wait_seconds_count", **labels) == 10
    assert total(samples, "celery_redislock_fair_wait_seconds_sum", **labels) > 0
    quantiles = {found["quantile"]: value for found, value
                 in samples["celery_redislock_fair_tenant_wait_seconds"]
                 if found.get("task") == metrics_app.FAIR}
    assert set(quantiles) == {"0.5", "0.9", "0.99", "1"}  # one series per quantile
    assert 0 <= quantiles["0.5"] <= quantiles["0.9"] <= quantiles["1"]
    assert quantiles["1"] > 0  # one slot, ten runs of 0.1 s: someone waited


def test_a_killed_pool_child_leaves_no_live_gauge(cluster: WorkerCluster) -> None:
    """A pool child killed while it holds a slot: its ``holding`` gauge goes away with it,
    its counters stay, and the child that replaces it records on."""
    url = exporter(cluster)
    record = record_store(cluster)
    task = cluster.app.tasks[CONTENDED]
    doomed = task.delay(30)
    wait_until(lambda: record.hexists("pid", doomed.id), 20, "the long run to start")
    wait_until(lambda: total(scrape(url), "celery_redislock_holding", task=CONTENDED) == 1,
               20, "the gauge to show the run holding its slot")
    os.kill(int(record.hget("pid", doomed.id)), signal.SIGKILL)

    wait_until(lambda: total(scrape(url), "celery_redislock_holding") == 0, 20,
               "the killed child's gauge to be dropped")
    after = task.delay(0.01)
    wait_for_results(cluster, [after])
    samples = scrape(url)
    assert total(samples, "celery_redislock_acquisitions_total", task=CONTENDED) == 2
    assert total(samples, "celery_redislock_hold_seconds_count", task=CONTENDED) == 1
    assert total(samples, "celery_redislock_holding") == 0


def signal_records(cluster: WorkerCluster) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in record_store(cluster).lrange("signals", 0, -1)]


def test_signals_fire_with_their_documented_kwargs(cluster: WorkerCluster) -> None:
    """Every signal, sent from the pool children of a real worker, with the kwargs that
    signals.py documents; and the contention log line names the task id and the key."""
    app = cluster.app
    # Four rated runs while both pool processes are free: the first starts at once, a
    # run whose start is near is booked it, one promised a start further off parks at
    # the rate's line (rate_limited, no countdown).
    rated = [app.tasks[RATED].delay() for _ in range(4)]
    first, second = (app.tasks[CONTENDED].delay(0.5) for _ in range(2))
    wait_for_results(cluster, [first, second, *rated])

    # A lease that ends while its run still works (its entry wiped from the semaphore,
    # as a lease that ran out would be): the next renewal finds it gone.
    record = record_store(cluster)
    lost = app.tasks[SHORT_LEASE].delay(1.5)
    wait_until(lambda: record.hexists("started", lost.id), 20, "the short-lease run to start")
    lock_store(cluster).delete(semaphore_key(SHORT_LEASE))
    wait_for_results(cluster, [lost])

    seen = signal_records(cluster)
    for entry in seen:
        assert entry["kwargs"] == DOCUMENTED_KWARGS[entry["signal"]], entry
    by_signal: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for entry in seen:
        by_signal[entry["signal"]].append(entry)
    assert set(by_signal) == set(DOCUMENTED_KWARGS)

    acquired = {e["task_id"]: e for e in by_signal["lock_acquired"]}
    released = {e["task_id"]: e for e in by_signal["lock_released"]}
    assert set(acquired) == {first.id, second.id, lost.id, *(r.id for r in rated)}
    assert set(released) == {first.id, second.id, lost.id}  # rate-only runs hold no slot
    for task_id in (first.id, second.id):
        assert acquired[task_id]["lease_name"] == CONTENDED
        assert acquired[task_id]["sender"] == CONTENDED
        assert released[task_id]["held"] >= 0.5
        assert released[task_id]["lease_fence"] == acquired[task_id]["lease_fence"]

    contended = [e for e in by_signal["lock_contended"] if e["sender"] == CONTENDED]
    assert contended, "neither contended run was ever refused"
    waiter = contended[0]["task_id"]
    assert {e["task_id"] for e in contended} == {waiter}
    for entry in contended:
        assert entry["key"] == CONTENDED
        assert entry["countdown"] == 0  # parked: no countdown
        assert CONTENDED in entry["reason"]
    assert acquired[waiter]["waited"] > 0
    contention_lines = [line for line in cluster.logs().splitlines()
                        if f"[{waiter}]" in line and repr(CONTENDED) in line]
    assert contention_lines, "no log line names both the refused run's id and its key"

    limited = by_signal["rate_limited"]
    assert limited and {e["sender"] for e in limited} == {RATED}
    assert all(e["key"] == RATED for e in limited)
    # Parked (a rate's parking script answers a park, never a countdown): neither a
    # countdown nor a promised start.
    assert all(e["countdown"] == 0 and e["promise"] is None for e in limited)

    assert [(e["task_id"], e["lease_name"]) for e in by_signal["lease_lost"]] == [
        (lost.id, SHORT_LEASE)]


def test_recorder_labels_and_budget_in_process() -> None:
    """The in-process model: the budget lets at most ``cap`` values through, ``other``
    included, and a failing label function counts under ``other``."""
    budget = LabelBudget(3)
    assert [budget.admit(v) for v in ("a", "b", "c", "a", "d")] == ["a", "b", OVERFLOW, "a",
                                                                     OVERFLOW]

    class Task:
        name = "proj.task"

    def broken(task: Any, key: Any) -> str:
        raise ValueError("no label")

    recorder = MetricsRecorder(MemorySink(), limit_label=broken, budget=LabelBudget(5))
    recorder.on_contended(sender=Task(), key="k", countdown=0.5)
    assert recorder.sink.value("contentions_total", task="proj.task", limit=OVERFLOW) == 1
    histogram = recorder.sink.histogram("countdown_seconds", task="proj.task",
                                        limit=OVERFLOW, cause="slots")
    assert (histogram.count, histogram.sum) == (1, 0.5)


@pytest.mark.usefixtures("lock_client")
def test_in_process_metrics_and_nothing_connected_when_off(celery_app: Any) -> None:
    """``enable_metrics`` with a MemorySink, on eager runs in this process; it connects one
    receiver to each signal, and ``disable_metrics`` takes them away again."""

    @celery_app.task(base=LimitedTask, lock_key="customer:{customer_id}", shared=False)
    def sync(customer_id: int) -> int:
        return customer_id

    every = (signals.lock_acquired, signals.lock_released, signals.lock_contended,
             signals.rate_limited, signals.lease_lost)
    before = [len(s.receivers) for s in every]  # other tests' receivers may be there
    recorder = enable_metrics(celery_app, max_limit_labels=5)
    assert [len(s.receivers) for s in every] == [n + 1 for n in before]
    try:
        assert enable_metrics(celery_app) is recorder
        assert [sync.apply((i,)).get() for i in range(3)] == [0, 1, 2]
        sink = recorder.sink
        assert isinstance(sink, MemorySink)
        labels = {"task": sync.name, "limit": "customer:{customer_id}"}
        assert sink.value("acquisitions_total", **labels) == 3
        assert sink.histogram("hold_seconds", **labels).count == 3
        assert sink.histogram("wait_seconds", **labels).sum == 0
        assert sink.value("holding", **labels) == 0
    finally:
        disable_metrics(celery_app)
    assert [len(s.receivers) for s in every] == before
    sync.apply((4,)).get()
    assert recorder.sink.value("acquisitions_total", **labels) == 3


def test_workers_on_one_machine_take_one_port_each_from_a_range(tmp_path: Any,
                                                                caplog: Any) -> None:
    """``redislock_metrics_port = "A-B"``: each worker's exporter serves the first port
    of the range that is free and names it in its log; the README's snippet with two
    workers on one machine no longer leaves the second without metrics."""
    app = Celery("ports", set_as_current=False)
    app.conf.redislock_metrics_addr = "127.0.0.1"
    exporters: List[Exporter] = []
    with socket.socket() as taken:  # the range's first port is someone else's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        first = taken.getsockname()[1]
        app.conf.redislock_metrics_port = f"{first}-{first + 40}"
        ports, addr = exporter_options(app)
        assert ports == tuple(range(first, first + 41)) and addr == "127.0.0.1"
        try:
            with caplog.at_level(logging.INFO, logger="celery_redislock"):
                for _ in range(2):  # two workers of the app on this machine
                    exporter = Exporter(app, ports, addr)
                    exporter.path = str(tmp_path)
                    exporter.start()
                    exporters.append(exporter)
            served = [exporter.server.server_port for exporter in exporters]
            assert len(set(served)) == 2 and all(first < port <= first + 40
                                                 for port in served), served
            for port in served:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=10) as response:
                    assert response.status == 200
                assert any(f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in
                           record.getMessage() for record in caplog.records), port
        finally:
            for exporter in exporters:
                exporter.stop()
    app.conf.redislock_metrics_port = "9818-9809"
    with pytest.raises(LockConfigurationError, match="or a range of them such as"):
        exporter_options(app)


@pytest.mark.usefixtures("lock_client")
def test_fair_limits_waits_by_tenant_quantile_without_a_series_per_tenant(
        celery_app: Any) -> None:
    """A limit with ``fair_by``: each admission's wait goes into the limit's histogram
    (labels task and limit only) and its tenant's recent mean; the gauge holds the
    quantiles of those means across tenants, one series per quantile."""

    @celery_app.task(base=LimitedTask, lock_key="exports", lock_slots=2,
                     lock_fair_by="tenant:{tenant}", shared=False)
    def export(tenant: str) -> str:
        return tenant

    recorder = enable_metrics(celery_app, max_limit_labels=5)
    try:
        assert [export.apply((t,)).get() for t in ("a", "b")] == ["a", "b"]  # eager: 0 s
        labels = {"task": export.name, "limit": "exports"}
        assert recorder.sink.histogram("fair_wait_seconds", **labels).count == 2
        assert recorder.tenant_waits[(export.name, "exports")].means() == {
            "tenant:a": 0.0, "tenant:b": 0.0}  # the tenant from the run's request

        class Held:
            name, holds_slots = "exports", False

        task = export._get_current_object()  # the task, not its proxy: as signals send it
        waits = {f"tenant:{n}": float(n) for n in range(300)}  # more tenants than are kept
        for tenant, waited in waits.items():
            task.push_request(args=(tenant.split(":")[1],), kwargs={})
            try:
                recorder.on_acquired(sender=task, lease=Held(), waited=waited)
            finally:
                task.pop_request()
        histogram = recorder.sink.histogram("fair_wait_seconds", **labels)
        assert (histogram.count, histogram.sum) == (302, sum(waits.values()))
        kept = recorder.tenant_waits[(export.name, "exports")].means()
        assert len(kept) == 200 and min(kept.values()) == 100.0  # the last 200 admitted
        assert "tenant:a" not in kept
        gauge = {q: recorder.sink.value("fair_tenant_wait_seconds", **labels, quantile=q)
                 for q in ("0.5", "0.9", "0.99", "1")}
        assert gauge == {"0.5": 199.0, "0.9": 279.0, "0.99": 297.0, "1": 299.0}
        series = recorder.sink.snapshot()["fair_tenant_wait_seconds"]
        assert len(series) == 4  # one per quantile, whatever the number of tenants
    finally:
        disable_metrics(celery_app)
