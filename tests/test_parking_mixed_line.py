"""End to end: a task under two slots AND a rate of 5 a second waits on the parking line
(``redislock_line = "broker"``; ``lua/parked_rates.lua``): 40 runs sent at once, at most
two bodies at once (recorded inside the bodies), at most 5 + burst starts in any second,
every run once, none sent back as a copy with a countdown. Real ``celery worker``
processes (:mod:`parking_rate_app`) on a private redis-server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from parking_rate_app import BURST, RATED_PREFIX, RATED_TWO_SLOTS
from test_parking_rate_line import most_in_a_second

from cluster_checks import peaks, record_store, wait_until
from parking_app import LINE_ENV

if TYPE_CHECKING:
    from worker_cluster import WorkerClusterFactory

pytestmark = pytest.mark.slow


@pytest.fixture
def start_cluster(start_workers: WorkerClusterFactory) -> WorkerClusterFactory:
    return lambda **options: start_workers("parking_rate_app", {LINE_ENV: "broker"}, **options)


def test_two_slots_and_five_a_second_park_forty_runs(start_cluster: Any) -> None:
    cluster = start_cluster()
    record = record_store(cluster)
    task = cluster.app.tasks[RATED_TWO_SLOTS]
    results = [task.delay(0.3, key="both") for _ in range(40)]
    wait_until(lambda: all(result.ready() for result in results), 60.0, "40 results",
               interval=0.1)
    assert [result.status for result in results] == ["SUCCESS"] * 40
    assert [int(record.get(f"runs:{result.id}") or 0) for result in results] == [1] * 40
    peak = max(peaks(record, RATED_PREFIX + "both"))
    admitted = [int(value) * 1000 for value in record.hgetall("admitted").values()]
    starts = [int(value) for value in record.hgetall("started").values()]
    span = (max(starts) - min(starts)) / 1e6
    print(f"\npeak {peak}; most in a second: {most_in_a_second(admitted)} admitted, "
          f"{most_in_a_second(starts, 900_000)} bodies (0.9 s windows); 40 runs in "
          f"{span:.1f} s")
    assert peak <= 2
    assert len(admitted) == 40 and most_in_a_second(admitted) <= 5 + BURST
    assert most_in_a_second(starts, 900_000) <= 5 + BURST
    logs = cluster.logs()
    assert " parked: " in logs and " deferred: " not in logs  # no copy with a countdown
    assert 'cannot park its runs' not in logs
