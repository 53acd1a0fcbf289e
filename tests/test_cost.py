"""Weighted runs (``lock_cost``): a run takes N slots, or uses N starts of its rate, at
once or not at all; a heavy run waiting at the head of a line is not starved by light
ones."""

from __future__ import annotations

from typing import Any, Iterator, List

import pytest
from celery import Celery

from celery_redislock import (
    Busy,
    LimitedTask,
    LockConfigurationError,
    LockCostError,
    RateLimited,
    Semaphore,
    check_limits,
)
from celery_redislock.admin import control
from celery_redislock.admin.cli import status_row
from celery_redislock.engine.admission import Lease, RateLimit, SlotLimit, admit
from celery_redislock.engine.keys import semaphore_key
from celery_redislock.engine.rate import Rate
from celery_redislock.engine.scripts import RELEASE_OWNER
from celery_redislock.line import handoff
from celery_redislock.line.waiting import describe

import features_app
from cluster_checks import (
    assert_each_ran_once,
    assert_slots_all_given_back,
    record_store,
    wait_for_results,
    wait_until,
)
from features_app import WEIGHTED, WEIGHTED_SLOTS, WEIGHTED_SLOTS_KEY
from worker_cluster import WorkerCluster


def export(batch): ...


def _task(**options):
    app = Celery("cost", broker="memory://", set_as_current=False)
    return app.task(base=LimitedTask, name="proj.export", shared=False, **options)(export)


@pytest.mark.parametrize("options, problem", [
    ({"lock_rate": "10/s", "lock_cost": 3}, r"lock_cost 3 is above .* \(lock_burst \+ 1 = 2\)"),
    ({"lock_rate": "10/s", "lock_cost": 0}, "lock_cost must be a whole number, 1 to 1000001"),
    ({"lock_rate": "10/s", "lock_cost": 2.5}, "lock_cost must be a whole number"),
    ({"lock_slots": 3, "lock_cost": 4}, r"lock_cost 4 is above lock_slots 3, so no run"),
    ({"lock_slots": 3, "lock_cost": "2"}, "or a callable of the task's arguments"),
    ({"lock_slots": 3, "lock_cost": lambda customer: 1}, "callable needs argument 'customer'"),
])
def test_cost_above_the_limit_fails_at_definition(options, problem) -> None:
    with pytest.raises(LockConfigurationError, match=problem):
        _task(**options).task_limits()


def test_a_cost_above_both_limits_lists_both_problems() -> None:
    with pytest.raises(LockConfigurationError) as caught:
        _task(lock_slots=2, lock_rate="10/s", lock_burst=1, lock_cost=3).task_limits()
    assert [problem.split(": ", 1)[1][:28] for problem in caught.value.problems] == [
        "lock_cost 3 is above lock_sl", "lock_cost 3 is above what th"]


def test_a_callable_cost_is_worked_out_per_call_and_checked() -> None:
    """The callable is given the task's arguments by name; a cost no run could start with
    is a clear error for that call (the run fails before it takes anything)."""
    def cost_of(batch):
        return len(batch)

    limits = _task(lock_slots=4, lock_cost=cost_of).task_limits()
    assert [limiter.cost for limiter in limits.limiters((["a", "b"],), {}, "x:")] == [2]
    assert limits.limiters((), {"batch": ["a"]}, "x:")[0].cost == 1
    assert limits.slot_keys((["a"] * 9,), {}, "x:") == [semaphore_key("proj.export", "x:")]
    with pytest.raises(LockCostError, match=r"cost_of\(\) gave 5 for this call, above "
                                            r"lock_slots 4: the run could never be admitted"):
        limits.limiters((["a"] * 5,), {}, "x:")
    with pytest.raises(LockCostError, match="gave 0 for this call; a cost is a whole number"):
        limits.limiters(([],), {}, "x:")
    with pytest.raises(LockCostError, match=r"cost_of\(\) failed .*TypeError"):
        limits.limiters((None,), {}, "x:")


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
    """10/s, burst 1, each run costing 2: on two workers, 10 runs start 200 ms apart.

    Judged by the admissions (the lease's ``acquired_at_ms``, server clock), as the limit
    decides them: a body records its start after its run was handed to a pool process,
    later by however long that took, which on a busy machine may bring two recorded starts
    closer than their admissions."""
    task = cluster.app.tasks[WEIGHTED]
    record = record_store(cluster)
    for _ in range(10):
        task.delay()
    wait_until(lambda: record.hlen("started") >= 10, 30, "10 weighted runs")
    admitted = sorted(int(value) / 1e3 for value in record.hvals("admitted"))
    starts = sorted(int(value) / 1e6 for value in record.hvals("started"))
    assert len(admitted) == len(starts) == 10
    gaps = [b - a for a, b in zip(admitted, admitted[1:])]
    print(f"\nweighted runs: admitted {(len(admitted) - 1) / (admitted[-1] - admitted[0]):.2f}/s, "
          f"smallest gap {min(gaps) * 1000:.0f} ms; started "
          f"{(len(starts) - 1) / (starts[-1] - starts[0]):.2f}/s")
    assert min(gaps) > 0.15, gaps  # 200 ms apart
    assert (len(admitted) - 1) / (admitted[-1] - admitted[0]) < 5.5
    assert (len(starts) - 1) / (starts[-1] - starts[0]) < 5.5


# -- weighted slots, in the engine ---------------------------------------------------------

PREFIX = "redislock:"
RESERVE_MS = handoff.reservation_ms(30)


def _members(client: Any, name: str) -> List[Any]:
    """The holder entries and units of semaphore ``name`` (statistics left out)."""
    key = semaphore_key(name, PREFIX)
    return [(member, score) for member, score in client.zrange(key, 0, -1, withscores=True)
            if score > 0]


def test_weighted_run_takes_its_slots_all_or_none(redis_client) -> None:
    """4 slots: a run of cost 3 takes 3 (every count sees them: holders, available, the
    refusal, the operators' state); a second one is refused, a light one fits; over two
    semaphores, a run takes its slots in both or in none."""
    sem = Semaphore(redis_client, "w", slots=4)
    heavy = admit(redis_client, [SlotLimit("w", 4, PREFIX, 3)], lease=30)
    assert isinstance(heavy, Lease) and heavy.costs == [3]
    assert (sem.holders(), sem.available()) == (3, 1)
    refused = admit(redis_client, [SlotLimit("w", 4, PREFIX, 3)], lease=30)
    assert isinstance(refused, Busy) and (refused.holders, refused.cost) == (3, 3)
    light = admit(redis_client, [SlotLimit("w", 4, PREFIX)], lease=30)
    assert isinstance(light, Lease) and sem.holders() == 4
    state = control.limit_state(redis_client, "w")
    assert (state.used, len(state.live_holders)) == (4, 2)
    assert sorted(holder.cost for holder in state.live_holders) == [1, 3]
    assert {field: status_row(state)[field] for field in ("holders", "used")} == {
        "holders": 2, "used": 4}

    other = Semaphore(redis_client, "other", slots=4)
    both = [SlotLimit("other", 4, PREFIX, 2), SlotLimit("w", 4, PREFIX, 2)]
    assert isinstance(admit(redis_client, both, lease=30), Busy)  # "w" has none free
    assert other.holders() == 0, "nothing was taken in the semaphore that had room"
    assert heavy.release() and sem.holders() == 1
    assert not heavy.release(), "released twice"
    together = admit(redis_client, both, lease=30)
    assert isinstance(together, Lease) and (other.holders(), sem.holders()) == (2, 3)
    assert together.release() and (other.holders(), sem.holders()) == (0, 1)


def test_weighted_lease_is_renewed_adopted_and_released_whole(redis_client) -> None:
    lease = admit(redis_client, [SlotLimit("whole", 5, PREFIX, 4)], lease=30)
    assert isinstance(lease, Lease)
    redis_client.zadd(semaphore_key("whole", PREFIX),
                      {member: score - 20_000 for member, score in _members(redis_client,
                                                                             "whole")})
    assert lease.renew()
    scores = {score for _, score in _members(redis_client, "whole")}
    assert len(_members(redis_client, "whole")) == 4 and scores == {lease.expires_at_ms}
    adopted = Lease.adopt(redis_client, lease.handover(), '{"pid": 7}')
    assert adopted is not None and adopted.costs == [4]
    members = _members(redis_client, "whole")
    assert len(members) == 4 and {score for _, score in members} == {adopted.expires_at_ms}
    assert sum(b'{"pid": 7}' in member for member, _ in members) == 1
    handed: List[Any] = []
    adopted.release_soon(handed.extend)  # uncontended: one ZREM of entry and units
    assert Semaphore(redis_client, "whole", slots=5).holders() == 0 and handed == []


def test_a_dead_runs_weighted_slots_are_recovered_whole(redis_client) -> None:
    """The worker frees a dead run's slots by its token's prefix: the units go too."""
    lease = admit(redis_client, [SlotLimit("dead", 4, PREFIX, 3)], lease=30,
                  owner="w1@host|task-9|5eed:")
    keep = admit(redis_client, [SlotLimit("dead", 4, PREFIX)], lease=30,
                 owner="w1@host|task-10|5eed:")
    assert isinstance(lease, Lease) and isinstance(keep, Lease)
    key = semaphore_key("dead", PREFIX)
    assert int(RELEASE_OWNER.run(redis_client, [key], ["w1@host|task-9|5eed:", 0])[0]) == 3
    assert Semaphore(redis_client, "dead", slots=4).holders() == 1
    lost = redis_client.hkeys(key.replace("}:s:", "}:l:"))
    assert [member.split(b" ")[0] for member in lost] == [lease.token.encode()]
    # An operator frees a holder by its token: its units go with it.
    heavy = admit(redis_client, [SlotLimit("dead", 4, PREFIX, 3)], lease=30)
    assert isinstance(heavy, Lease)
    assert control.release_holder(redis_client, "dead", heavy.token).token == heavy.token
    assert Semaphore(redis_client, "dead", slots=4).holders() == 1


def test_a_weighted_lease_is_reasserted_whole_after_a_loss_of_the_store(redis_client) -> None:
    lease = admit(redis_client, [SlotLimit("lossy", 4, PREFIX, 3)], lease=5)
    assert isinstance(lease, Lease)
    redis_client.flushdb()  # the store lost its data: the holder writes its lease back
    assert lease.renew() and not lease.lost
    assert Semaphore(redis_client, "lossy", slots=4).holders() == 3
    assert lease.release() and Semaphore(redis_client, "lossy", slots=4).holders() == 0


def test_weighted_runs_share_the_slots_by_cost(cluster: WorkerCluster) -> None:
    """4 slots on two prefork workers of two processes: runs of cost 3 and 1 (the cost a
    callable of the task's argument). The costs of the bodies running at once never add
    up to more than 4, every run runs once, and every slot comes back."""
    task = cluster.app.tasks[WEIGHTED_SLOTS]
    costs = [3, 1, 1, 3, 1, 3, 1, 1, 3, 1, 1, 3]
    results = [task.delay(cost) for cost in costs]
    wait_for_results(cluster, results)
    record = record_store(cluster)
    assert_each_ran_once(record, results)
    weights = [int(value) for value in record.lrange("weights", 0, -1)]
    print(f"\nweighted slots: peak {max(weights)} of 4, sums at starts {weights}")
    assert len(weights) == len(costs) and max(weights) <= 4, weights
    assert_slots_all_given_back(cluster, [WEIGHTED_SLOTS_KEY])
    assert "could not ask its limits" not in cluster.logs()  # the main process asked


def test_a_run_whose_callable_cost_is_above_the_limit_fails_clearly(redis_server) -> None:
    """The run fails with LockCostError, naming the task and the cost, and takes nothing."""
    app = Celery("cost", broker="memory://", set_as_current=False)
    app.conf.redislock_url = f"redis://127.0.0.1:{redis_server.port}/0"

    @app.task(base=LimitedTask, name="proj.sized", shared=False, lock_slots=2,
              lock_cost=lambda size: size)
    def sized(size): return size

    assert sized.apply(args=(2,)).get() == 2
    failed = sized.apply(args=(3,))
    assert isinstance(failed.result, LockCostError)
    assert "Task 'proj.sized': lock_cost <lambda>() gave 3 for this call, above lock_slots 2" \
        in str(failed.result)
    assert Semaphore(redis_server.client(), "proj.sized", slots=2).holders() == 0


def test_a_deferred_weighted_run_says_how_many_slots_it_needs() -> None:
    refusal = Busy(name="gpu:a", holders=2, slots=4, retry_hint=1.0, average_hold=None,
                   server_time_ms=0, cost=3)
    assert describe(refusal) == "needs 3 of the 4 slots of 'gpu:a' at once and found 2 taken"


def test_redislock_limits_weigh_slots_with_cost() -> None:
    """``{"cost": N}`` in ``redislock_limits``: checked against the entry's slots too."""
    app = Celery("cost", broker="memory://", set_as_current=False)

    @app.task(name="proj.tasks.bulk_sync", shared=False)
    def bulk_sync(shop): ...

    app.conf.redislock_limits = {"proj.tasks.bulk_sync": {"slots": 2, "cost": 3}}
    with pytest.raises(LockConfigurationError, match=r"cost 3 is above slots 2"):
        check_limits(app)
    app.conf.redislock_limits = {"proj.tasks.bulk_sync": {"slots": 4, "cost": 3,
                                                          "key": "shop:{shop}"}}
    check_limits(app)
