"""End to end: a moved copy that waits in its queue past its reservation's 10 s (its
worker is busy) keeps the slot reserved for it (``engine/late.py``), instead of the
slot going to the next parked run and the late copy parking again behind it.

Real ``celery worker`` processes (:mod:`parking_app`, one process each, Celery's default
prefetch of one) on private redis-servers. worker2 holds the one slot of ``one:lk``; two
runs, V then W, park behind it from worker1; worker1 is then made busy (one long body,
one more run held for its process), so that V's copy, moved back to worker1's queue at
the holder's end, waits there past the end its reservation was given. Before, the poll
handed the lapsed slot on: W's copy was moved and ran first, and V parked again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List

import pytest
import redis
from celery.utils.nodenames import worker_direct
from test_parking_backup_worker import _parked
from test_parking_line import _broker, _nodes

from celery_redislock.engine.keys import semaphore_key

from cluster_checks import peaks, record_store, wait_for_results, wait_until
from parking_app import LINE_ENV, ONE, ONE_PREFIX

if TYPE_CHECKING:
    from worker_cluster import WorkerClusterFactory

pytestmark = pytest.mark.slow

TIMEOUT = 60.0


def test_a_late_copy_keeps_its_reservation_under_a_busy_worker(
        start_workers: WorkerClusterFactory) -> None:
    _late_copy_behind_a_busy_worker(start_workers, past_first_end_ms=1000)


def test_a_late_copy_keeps_its_turn_however_long_it_waits(
        start_workers: WorkerClusterFactory) -> None:
    """V's copy waits past 60 s beyond its reservation's first end (the bound before:
    there its slot lapsed to W): still seen queued, it keeps its key's turn."""
    _late_copy_behind_a_busy_worker(start_workers, past_first_end_ms=65_000)


def _late_copy_behind_a_busy_worker(start_workers: WorkerClusterFactory,
                                    past_first_end_ms: int) -> None:
    """V's copy held in worker1's queue until ``past_first_end_ms`` past its
    reservation's first end: the reservation is still live, W not moved; then both run
    once each, in turn, one at a time."""
    cluster = start_workers("parking_app", {LINE_ENV: "broker"}, concurrency=1)
    record, broker = record_store(cluster), _broker(cluster)
    assert cluster.urls is not None
    lock = redis.Redis.from_url(cluster.urls.lock)
    key = semaphore_key(ONE_PREFIX + "lk")
    task, nodes = cluster.app.tasks[ONE], _nodes(cluster)
    to_worker1 = worker_direct(nodes["worker1"])
    hold = TIMEOUT + past_first_end_ms / 1000
    holder = task.apply_async((hold,), {"key": "lk", "until": "lk"},
                              queue=worker_direct(nodes["worker2"]))
    wait_until(lambda: record.hexists("started", holder.id), TIMEOUT, "the holder to start")
    first = task.apply_async((0.05,), {"key": "lk"}, queue=to_worker1)
    wait_until(lambda: _parked_count(broker) == 1, TIMEOUT, "V to park")
    second = task.apply_async((0.05,), {"key": "lk"}, queue=to_worker1)
    wait_until(lambda: _parked_count(broker) == 2, TIMEOUT, "W to park")
    busy = task.apply_async((hold,), {"key": "busy", "until": "busy"}, queue=to_worker1)
    wait_until(lambda: record.hexists("started", busy.id), TIMEOUT, "worker1's long body")
    held = task.apply_async((0.05,), {"key": "held"}, queue=to_worker1)
    wait_until(lambda: broker.llen(to_worker1.name) == 0 and broker.hlen("unacked") >= 1,
               TIMEOUT, "worker1 to hold one more run for its process")
    record.rpush("go:lk", "1")  # the holder ends: its release moves V's copy to worker1
    wait_until(lambda: broker.llen(to_worker1.name) == 1, TIMEOUT, "V's copy to be moved")
    wait_until(lambda: _reservations(lock, key) != {}, TIMEOUT, "the reservation")
    [(member, given_end)] = _reservations(lock, key).items()
    wait_until(lambda: _server_ms(lock) > given_end + past_first_end_ms,
               TIMEOUT + past_first_end_ms / 1000, "the reservation's first end to pass")
    assert _reservations(lock, key).get(member, 0) > _server_ms(lock)  # kept, still live
    assert broker.llen(to_worker1.name) == 1 and _parked_count(broker) == 1  # W not moved
    record.rpush("go:busy", "1")
    wait_for_results(cluster, [first, second, busy, held, holder])
    assert [int(record.get(f"runs:{run.id}") or 0) for run in (first, second)] == [1, 1]
    assert _started_ms(record, first.id) < _started_ms(record, second.id)  # in turn
    assert int(lock.hget(key.replace("}:s:", "}:pn:", 1), "n") or 0) == 2  # parked once each
    assert max(peaks(record, ONE_PREFIX + "lk")) == 1


def _parked_count(broker: redis.Redis) -> int:
    queue = _parked(broker)
    return int(broker.llen(queue)) if queue else 0


def _reservations(lock: redis.Redis, key: str) -> Dict[str, int]:
    found: List = lock.zrange(key.replace("}:s:", "}:pv:", 1), 0, -1, withscores=True)
    return {member.decode(): int(end) for member, end in found}


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _started_ms(record: redis.Redis, task_id: str) -> float:
    return float(record.hget("started", task_id) or 0)
