"""The Grafana dashboard shipped in docs/grafana queries only series the package exports,
with only the labels they carry, and shows every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Iterator, Set

import prometheus_client

from celery_redislock.metrics import METRICS
from celery_redislock.metrics.prometheus import PrometheusSink

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "celery-redislock.json"

#: Labels Prometheus adds to every scraped series, and the histogram buckets' own.
SCRAPE_LABELS = {"instance", "job", "le"}


def exported_series() -> Dict[str, Set[str]]:
    """{series name: its labels} of everything the exporter serves, read from the text
    exposition of a sink that recorded one value of each metric."""
    sink = PrometheusSink()
    registry = prometheus_client.CollectorRegistry()
    for spec in METRICS:
        registry.register(sink.metrics[spec.name])
        labels = {name: "x" for name in spec.labels}
        if spec.kind == "histogram":
            sink.observe(spec, labels, 1.0)
        else:
            sink.inc(spec, labels)
    series: Dict[str, Set[str]] = {}
    for line in prometheus_client.generate_latest(registry).decode().splitlines():
        found = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if found and not line.startswith("#"):
            labels = set(re.findall(r'([a-zA-Z_]\w*)="', found.group(2) or ""))
            series.setdefault(found.group(1), set()).update(labels)
    return series


def expressions(node: object) -> Iterator[str]:
    """Every PromQL text of the dashboard: panel targets and variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from expressions(value)


def test_dashboard_queries_only_exported_series_and_labels():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series()
    queries = list(expressions(dashboard))
    assert queries
    used = set()
    for query in queries:
        names = set(re.findall(r"\bcelery_redislock_\w+", query))
        assert names, f"a query of no celery-redislock series: {query}"
        unknown = names - set(exported)
        assert not unknown, f"{query}: the package exports no {sorted(unknown)}"
        labels = set(SCRAPE_LABELS).union(*(exported[name] for name in names))
        grouped = {label.strip() for group in re.findall(r"\bby \(([^)]*)\)", query)
                   for label in group.split(",") if label.strip()}
        matched = set(re.findall(r"([a-z_]+)=~?\"", query))
        assert grouped | matched <= labels, f"{query}: labels {sorted(grouped | matched - labels)}"
        used |= names
    families = {f"celery_redislock_{spec.name}" for spec in METRICS}
    shown = {family for family in families
             if any(name == family or name.startswith(family + "_") for name in used)}
    assert shown == families, f"not on the dashboard: {sorted(families - shown)}"


def test_dashboard_is_importable_grafana_json():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
