"""Weighted runs (``lock_cost``): a run uses N starts of its rate at once, or none."""

from __future__ import annotations

from typing import Iterator

import pytest
from celery import Celery

from celery_redislock import LimitedTask, LockConfigurationError, RateLimited
from celery_redislock.admin import control
from celery_redislock.engine.admission import Lease, RateLimit, admit
from celery_redislock.engine.rate import Rate

import features_app
from cluster_checks import record_store, wait_until
from features_app import WEIGHTED
from worker_cluster import WorkerCluster


def export(batch): ...


def _task(**options):
    app = Celery("cost", broker="memory://", set_as_current=False)
    return app.task(base=LimitedTask, name="proj.export", shared=False, **options)(export)


@pytest.mark.parametrize("options, problem", [
    ({"lock_rate": "10/s", "lock_cost": 3}, r"lock_cost 3 is above .* \(lock_burst \+ 1 = 2\)"),
    ({"lock_rate": "10/s", "lock_cost": 0}, "lock_cost must be a whole number, 1 to 1000001"),
    ({"lock_rate": "10/s", "lock_cost": 2.5}, "lock_cost must be a whole number"),
    ({"lock_slots": 3, "lock_cost": 2}, "a limit with 'lock_slots' cannot have one"),
])
def test_cost_above_the_limit_fails_at_definition(options, problem) -> None:
    with pytest.raises(LockConfigurationError, match=problem):
        _ = _task(**options).name


def test_weighted_run_takes_all_its_starts_or_none(redis_client) -> None:
    """10/s with burst 4: after a quiet spell 5 starts may go at once. A run costing 5
    takes them all; the next one, of any cost, is refused and waits ~0.5 s (5 intervals)
    for a cost of 5, ~0.1 s for a cost of 1; nothing is taken by a refusal."""
    rate = Rate.parse("10/s", 4)
    heavy = RateLimit("export", rate, "redislock:", 5)
    light = RateLimit("export", rate, "redislock:")
    assert isinstance(admit(redis_client, [heavy], lease=10), Lease)
    refused = admit(redis_client, [heavy], lease=10, promises={heavy.key: -1})
    assert isinstance(refused, RateLimited) and 0.4 < refused.wait <= 0.5
    light_refused = admit(redis_client, [light], lease=10, promises={light.key: -1})
    assert isinstance(light_refused, RateLimited) and 0.0 < light_refused.wait <= 0.1


def test_weighted_cost_follows_a_rate_set_at_run_time(redis_client) -> None:
    rate = Rate.parse("10/s", 1)
    heavy = RateLimit("export", rate, "redislock:", 2)
    control.set_rate(redis_client, "export", "1/s")
    assert isinstance(admit(redis_client, [heavy], lease=10), Lease)
    refused = admit(redis_client, [heavy], lease=10, promises={heavy.key: -1})
    assert isinstance(refused, RateLimited) and 1.9 < refused.wait <= 2.0


def test_cost_option_compiles() -> None:
    rules = _task(lock_rate="10/s", lock_burst=4, lock_cost=5).task_limits().rules
    assert [(rule.cost, rule.rate.burst) for rule in rules] == [(5, 4)]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path_factory.mktemp("cost-workers"), app_module="features_app",
                       app_factory=features_app.create_app, workers=2,
                       concurrency=2) as started:
        yield started


@pytest.mark.slow
def test_weighted_runs_start_at_their_share_of_the_rate(cluster: WorkerCluster) -> None:
    """10/s, burst 1, each run costing 2: on two workers, 10 runs start 200 ms apart."""
    task = cluster.app.tasks[WEIGHTED]
    record = record_store(cluster)
    for _ in range(10):
        task.delay()
    wait_until(lambda: record.hlen("started") >= 10, 30, "10 weighted runs")
    starts = sorted(int(value) / 1e6 for value in record.hvals("started"))
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    print(f"\nweighted runs: {(len(starts) - 1) / (starts[-1] - starts[0]):.2f}/s, "
          f"smallest gap {min(gaps) * 1000:.0f} ms")
    assert min(gaps) > 0.15, gaps  # 200 ms apart, less the recording's jitter
    assert (len(starts) - 1) / (starts[-1] - starts[0]) < 5.5
