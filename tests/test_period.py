"""At most one run per period (``lock_period``), across two real prefork workers.

Start times are the Redis server's clock, recorded in the bodies (see :mod:`features_app`).
"""

from __future__ import annotations

import logging
from typing import Iterator

import pytest
from celery import Celery
from celery.app.task import Context

from celery_redislock import LimitedTask
from celery_redislock.engine.admission import Busy
from celery_redislock.integration.period import Deferred, check_period
from celery_redislock.line.waiting import describe

import features_app
from cluster_checks import record_store, wait_for_results, wait_until
from features_app import PERIODIC_DEFER, PERIODIC_DROP, UNIQUE_PERIOD
from support import LOCK_DB
from worker_cluster import WorkerCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path_factory.mktemp("period-workers"), app_module="features_app",
                       app_factory=features_app.create_app, workers=2,
                       concurrency=2) as started:
        yield started


def test_runs_within_the_period_are_dropped(cluster: WorkerCluster) -> None:
    """A plain task with {"period": "3s"} from the setting: of 6 sent at once, one runs and
    five end IGNORED (naming the run that took the period); once the period is over, a
    new one runs."""
    task = cluster.app.tasks[PERIODIC_DROP]
    record = record_store(cluster)
    sent = [task.delay("a") for _ in range(6)]
    wait_until(lambda: all(result.state in ("SUCCESS", "IGNORED") for result in sent), 30,
               "every run to succeed or be dropped")
    ran = [result for result in sent if result.state == "SUCCESS"]
    dropped = [result for result in sent if result.state == "IGNORED"]
    assert len(ran) == 1 and len(dropped) == 5
    assert all(result.result["ran"] == ran[0].id for result in dropped)
    assert record.llen("peaks:drop:a") == 1
    assert task.delay("b").get(timeout=30)  # another key is not held back
    first_start = int(record.hget("started", ran[0].id))

    def next_one_runs() -> bool:
        result = task.delay("a")
        wait_until(lambda: result.state in ("SUCCESS", "IGNORED"), 30, "a run's end")
        return result.state == "SUCCESS"

    wait_until(next_one_runs, 20, "a run after the period", interval=0.2)
    starts = sorted(int(value) for value in record.hvals("started"))
    gap = (starts[-1] - first_start) / 1e6
    print(f"\nnext run of the key started {gap:.2f} s after the first (period 3 s)")
    # The period runs from each run's mark, set just before its body records its start:
    # allow for the first body recording later after its mark than the second.
    assert gap >= 3.0 - 0.1
    assert record.llen("peaks:drop:a") == 2


def test_runs_within_the_period_are_deferred_to_its_end(cluster: WorkerCluster) -> None:
    """lock_period="2s", lock_period_mode="defer": 3 sent at once all run, each at least a
    period after the one before, on the Redis server's clock."""
    task = cluster.app.tasks[PERIODIC_DEFER]
    record = record_store(cluster)
    sent = [task.delay("d") for _ in range(3)]
    wait_for_results(cluster, sent)
    starts = sorted(int(record.hget("started", result.id)) / 1e6 for result in sent)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    print(f"\ndeferred runs' gaps: {', '.join(f'{gap:.2f}' for gap in gaps)} s (period 2 s)")
    assert all(gap >= 2.0 - 0.1 for gap in gaps), gaps  # as above: recording's jitter
    assert all(record.get(f"runs:{result.id}") == "1" for result in sent)


def test_unique_task_dropped_by_its_period_frees_its_unique_key(cluster: WorkerCluster) -> None:
    """lock_unique with lock_period: a send after the period's run ended is enqueued, and
    dropped; it does not keep the unique key for the queue lease (a later send is a new
    task, not the dropped one)."""
    task = cluster.app.tasks[UNIQUE_PERIOD]
    assert wait_for_results(cluster, [task.delay("x")])
    second = task.delay("x")
    wait_until(lambda: second.state == "IGNORED", 30, "the second run to be dropped")
    # Its state is stored as the body ends; its unique key is freed just after (a poll:
    # a send while the key is held returns the dropped task without sending anything).
    sends = []
    wait_until(lambda: sends.append(task.delay("x")) or sends[-1].id != second.id, 30,
               "a send after the drop to be a new task")
    third = sends[-1]
    wait_until(lambda: third.state == "IGNORED", 30, "the third run to be dropped")


# --- what the log says (in-process, on the lock store; the broker in memory) -------------


def _period_app(redis_server, **options):
    app = Celery("period_words", broker="memory://", set_as_current=False)
    app.conf.redislock_url = f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}"

    @app.task(base=LimitedTask, shared=False, name="proj.sync_shop", lock_key="sync:{shop}",
              **options)
    def sync_shop(shop):
        return shop

    return app.tasks["proj.sync_shop"]


def test_a_deferral_cut_short_by_the_visibility_timeout_says_why(redis_server, lock_client,
                                                                  caplog) -> None:
    """``lock_period="1h"``, ``defer``: the run comes back after half the broker's
    visibility_timeout (1800 s), not at the end of the hour, and the line says why."""
    task = _period_app(redis_server, lock_period="1h", lock_period_mode="defer")
    rule = task.task_limits().period
    check_period(task, rule, ("acme",), {}, Context(id="first", is_eager=False, retries=0))
    with caplog.at_level(logging.INFO, logger="celery_redislock"), \
            pytest.raises(Deferred):
        check_period(task, rule, ("acme",), {}, Context(id="second", is_eager=False,
                                                         retries=0))
    [line] = [record.getMessage() for record in caplog.records if "deferred" in
              record.getMessage()]
    assert "deferred 1800.00 s: first ran 'sync:acme' within its lock_period of 3600 s" in line
    assert "back in 1800.00 s, the longest countdown (half the broker's " \
           "visibility_timeout" in line and "then deferred again" in line, line


def test_a_period_only_task_is_refused_in_its_own_words(redis_server) -> None:
    """A task with only ``lock_period`` runs one at a time per key (lock_slots defaults
    to 1): a run refused for that is not said to find "all 1 slot(s)" taken."""
    busy = Busy(name="sync:acme", holders=1, slots=1, retry_hint=1.0, average_hold=None,
                server_time_ms=0)
    period_only = _period_app(redis_server, lock_period="10m")
    assert describe(busy, period_only) == (
        "found another run of 'sync:acme' under way (one at a time per key: the task "
        "gives no lock_slots)")
    assert describe(busy, _period_app(redis_server, lock_slots=1)) == \
        "found the only slot of 'sync:acme' taken"
    assert describe(busy.__class__(**{**busy.__dict__, "slots": 3, "holders": 3}),
                    _period_app(redis_server, lock_slots=3)) == \
        "found all 3 slots of 'sync:acme' taken"
