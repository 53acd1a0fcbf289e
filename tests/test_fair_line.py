"""Fair shares with real workers on the parking line (``fair_by``): one tenant's
backlog does not hold back the others' runs; never more than the cap at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, List

import pytest
import redis
from celery.result import AsyncResult

from cluster_checks import peaks, record_store, wait_until
from fair_app import FAIR, FAIR_SLOTS, create_app

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory

TIMEOUT = 60.0


@pytest.fixture
def start_cluster(worker_cluster_factory: WorkerClusterFactory
                  ) -> Iterator[Callable[..., WorkerCluster]]:
    def start(**options: Any) -> WorkerCluster:
        options.setdefault("workers", 2)
        options.setdefault("concurrency", 2)
        return worker_cluster_factory(app_module="fair_app", app_factory=create_app,
                                      **options)

    yield start


def results_of(cluster: WorkerCluster, results: List[AsyncResult]) -> None:
    def done() -> bool:
        cluster.check_running()
        return all(result.ready() for result in results)

    wait_until(done, TIMEOUT, f"{len(results)} results", interval=0.05)
    assert [result.status for result in results] == ["SUCCESS"] * len(results)


def ended(record: redis.Redis, results: List[AsyncResult]) -> List[int]:
    return sorted(int(record.hget("ended", result.id)) for result in results)


def test_a_backlog_does_not_hold_back_other_tenants(start_cluster: Any) -> None:
    """30 runs of one tenant sent first, then 2 runs of each of 4 tenants: the others'
    runs end among the first of the backlog's, not after all of it (first come first
    served: after the 30)."""
    cluster = start_cluster()
    record = record_store(cluster)
    task = cluster.app.tasks[FAIR]
    backlog = [task.delay(0.1, tenant="big") for _ in range(30)]
    wait_until(lambda: int(record.hlen("started")) >= 1, TIMEOUT, "the backlog's first")
    others = [task.delay(0.1, tenant=f"t{n}") for n in range(4) for _ in range(2)]
    results_of(cluster, backlog + others)
    big, small = ended(record, backlog), ended(record, others)
    before = sum(1 for end in big if end < small[-1])
    print(f"\nthe last other tenant's run ended after {before} of the backlog's 30")
    assert before <= 16
    assert max(peaks(record, "fair")) == FAIR_SLOTS
    assert " parked: " in cluster.logs()
