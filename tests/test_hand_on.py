"""End to end: a slot handed on in the worker's main process, from a run that ended to
the next run of its key waiting there (see :mod:`celery_redislock.gate.hand_on`),
with real prefork workers of :mod:`gate_app`.

The limit holds, each run runs once, a slot goes back through the lock store after at
most ``1 + HAND_ON_RUNS`` runs, and a slot handed on to a run of a worker killed with
SIGKILL comes back when its lease ends.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any, Dict, List

import pytest

from celery_redislock import Semaphore
from celery_redislock.engine.keys import semaphore_key
from celery_redislock.gate.hand_on import HAND_ON_RUNS

from cluster_checks import assert_slots_all_given_back, lock_store, peaks, record_store, wait_until
from gate_app import GATE_ENV, HANDED, HANDED_KEY, HANDED_LEASE, create_app

if TYPE_CHECKING:
    from worker_cluster import WorkerClusterFactory

pytestmark = pytest.mark.slow


def _tokens(record: Any) -> Dict[str, str]:
    return {str(task_id): str(token) for task_id, token in record.hgetall("tokens").items()}


def _handed_on(tokens: Dict[str, str]) -> List[str]:
    """The runs that ran under a slot handed on to them (a token naming another run)."""
    return [task_id for task_id, token in tokens.items() if f"|{task_id}|" not in token]


@pytest.mark.parametrize("gate", ["blocking", "async"])
def test_slots_handed_on_keep_the_limit_and_go_back_through_the_store(
        worker_cluster_factory: WorkerClusterFactory, monkeypatch: pytest.MonkeyPatch,
        gate: str) -> None:
    """Two workers of one process, a key of four slots, batches of 40 short runs (until
    one batch hands a slot on, within a deadline): runs are handed the slot of a run that
    ended in their worker; one slot (holder token) never serves two bodies at once, nor
    more than ``1 + HAND_ON_RUNS`` runs; never more than four bodies run at once, each
    runs once, and every slot comes back.

    One process per worker, by design: a worker holds at most its process's slot and one
    slot kept a moment for its next run (``spare.keep``), so two workers never ask
    for a fifth slot and the key is never contended. With two processes each, a worker
    could hold a slot more than its processes (kept, or its release on its way), a run
    was refused, and from then on the key kept its statistics of a contended key for a
    minute: no lease taken from it was handed on, and no later batch could."""
    monkeypatch.setenv(GATE_ENV, gate)
    cluster = worker_cluster_factory(workers=2, concurrency=1, app_module="gate_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    ids: List[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a batch on a loaded machine may hand on nothing
        batch = [cluster.app.send_task(HANDED, (0.02,)).id for _ in range(40)]
        wait_until(lambda batch=batch: all(record.hexists("ended", task_id)
                                           for task_id in batch), 120, "forty runs")
        ids += batch
        if _handed_on(_tokens(record)):
            break
    assert {task_id: record.get(f"runs:{task_id}") for task_id in ids} == dict.fromkeys(
        ids, "1")
    assert max(peaks(record, HANDED_KEY)) <= 4
    tokens = _tokens(record)
    assert _handed_on(tokens), "no run was handed a slot"
    assert max(collections.Counter(tokens.values()).values()) <= 1 + HAND_ON_RUNS
    assert max(max(peaks(record, token)) for token in set(tokens.values())) == 1
    assert_slots_all_given_back(cluster, [HANDED_KEY])


def test_a_slot_handed_on_in_a_worker_killed_comes_back_with_its_lease(
        worker_cluster_factory: WorkerClusterFactory) -> None:
    """A worker of one process runs a short run, and the next run of its key, waiting in
    the worker meanwhile, is handed its slot; the worker is killed with SIGKILL while
    that run holds it: the slot stays counted in the lock store (nobody else may take
    it) until its lease ends, then comes back."""
    cluster = worker_cluster_factory(workers=1, concurrency=1, app_module="gate_app",
                                     app_factory=create_app)
    record = record_store(cluster)
    for _ in range(20):  # a loaded machine may be too slow to hand on: pairs until one is
        pair = [cluster.app.send_task(HANDED, (0.05,)).id,
                cluster.app.send_task(HANDED, (0.0, True)).id]
        wait_until(lambda pair=pair: record.exists("holding") or all(
            record.hexists("ended", task_id) for task_id in pair), 30, "a pair of runs")
        if record.exists("holding"):
            break
    holding = record.get("holding")
    assert holding is not None, "no run was handed a slot"
    holding = str(holding)
    token = _tokens(record)[holding]
    semaphore = Semaphore(lock_store(cluster), HANDED_KEY)
    members = lock_store(cluster).zrangebyscore(semaphore_key(HANDED_KEY), 0, "+inf")
    assert [token for token in (member.decode().split(" ", 1)[0] for member in members)
            if "|" in token] == [token]
    cluster.worker("worker1").kill()
    killed = time.monotonic()
    assert semaphore.holders() == 1
    wait_until(lambda: semaphore.holders() == 0, HANDED_LEASE + 10,
               "the slot handed on to come back with its lease")
    assert time.monotonic() - killed <= HANDED_LEASE + 10
