"""End to end with RabbitMQ as the broker and Redis as the lock store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import kombu
import pytest

import rabbit_app
from cluster_checks import (
    assert_each_ran_once,
    assert_no_lease_lost,
    assert_slots_all_given_back,
    peaks,
    record_store,
    wait_for_results,
)
from worker_app import LIMITED_KEY, LIMITED_SLEEP

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster, WorkerClusterFactory


pytestmark = pytest.mark.slow


def rabbitmq_answers() -> bool:
    try:
        with kombu.Connection(rabbit_app.AMQP_URL, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


@pytest.fixture
def cluster(worker_cluster_factory: WorkerClusterFactory):
    if not rabbitmq_answers():
        pytest.skip(f"no RabbitMQ answers at {rabbit_app.AMQP_URL} "
                    "(set REDISLOCK_TEST_AMQP_URL to use another)")
    cluster = worker_cluster_factory(workers=2, concurrency=3, app_module="rabbit_app",
                                     app_factory=rabbit_app.create_app)
    yield cluster
    with cluster.app.connection_for_write() as connection:
        connection.default_channel.queue_delete(rabbit_app.queue_name(cluster.urls))


def test_limit_holds_with_rabbitmq_as_broker(cluster: WorkerCluster) -> None:
    """Countdown re-queueing goes through RabbitMQ; the semaphore lives in Redis."""
    task = cluster.app.tasks[LIMITED_SLEEP]
    results = [task.delay(0.2) for _ in range(16)]
    values = wait_for_results(cluster, results)
    record = record_store(cluster)
    assert sorted(values) == sorted(result.id for result in results)
    assert_each_ran_once(record, results)
    assert max(peaks(record, LIMITED_KEY)) == 2
    assert_slots_all_given_back(cluster, [LIMITED_SLEEP])
    assert_no_lease_lost(cluster)
