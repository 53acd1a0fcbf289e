"""Options of unique tasks and periods: checked at definition; keys; the error's contract."""

from __future__ import annotations

import pickle

import pytest
from celery import Celery

from celery_redislock import AlreadyQueued, LimitedTask, LockConfigurationError
from celery_redislock.config.limit import TaskLimits
from celery_redislock.engine.keys import period_key, semaphore_key, unique_key
from celery_redislock.engine.owned import OwnedLease


def _app() -> Celery:
    return Celery("unique_config", broker="memory://", set_as_current=False)


def job(job_id, full=False): ...


@pytest.mark.parametrize("options, problem", [
    ({"lock_unique": "yes"}, "lock_unique must be True or 'raise'"),
    ({"lock_unique": 1}, "lock_unique must be True or 'raise'"),
    ({"lock_unique_lease": 30}, "'lock_unique_lease' is given without 'lock_unique'"),
    ({"lock_unique": True, "lock_unique_lease": "soon"},
     "lock_unique_lease must be a duration"),
    ({"lock_period": "10x"}, "lock_period must be a duration"),
    ({"lock_period": 0}, "lock_period must be a duration from 0.001 to 2592000 s"),
    ({"lock_period": float("nan")}, "lock_period must be a duration from"),
    ({"lock_unique": True, "lock_unique_lease": 0.5},
     "lock_unique_lease must be a duration from 1 to"),
    ({"lock_period": "1m", "lock_period_mode": "later"}, "'drop' or 'defer'"),
    ({"lock_period_mode": "defer"}, "'lock_period_mode' is given without 'lock_period'"),
    ({"lock_unique": True, "lock_key": "job:{jobid}"}, "names argument 'jobid'"),
    ({"lock_uniqe": True}, "did you mean lock_unique?"),
    ({"lock_period_mod": "defer"}, "did you mean lock_period_mode?"),
])
def test_bad_options_fail_at_definition(options, problem) -> None:
    app = _app()
    with pytest.raises(LockConfigurationError, match=problem.replace("(", r"\(")):
        app.task(base=LimitedTask, name="proj.job", shared=False, **options)(job).task_limits()


def test_options_compile() -> None:
    app = _app()
    task = app.task(base=LimitedTask, name="proj.job", shared=False, lock_unique="raise",
                    lock_key="job:{job_id}", lock_period="10m",
                    lock_period_mode="defer")(job)
    limits = task.task_limits()
    assert limits.unique.mode == "raise" and limits.unique.queue_lease == 600
    assert limits.unique.key.render((7,), {}) == "job:7"
    assert limits.period.period == 600 and limits.period.mode == "defer"
    assert [rule.slots for rule in limits.rules] == [1]  # LimitedTask's default slot


def test_setting_entry_with_only_unique_limits_no_runs() -> None:
    limits = TaskLimits.compile("proj.job", job, [{"unique": True, "key": "job:{job_id}"}],
                                source="redislock_limits['proj.job']")
    assert limits.rules == ()
    assert limits.unique.key.render((), {"job_id": 3}) == "job:3"
    both = TaskLimits.compile("proj.job", job, [{"slots": 1},
                                                {"unique": True, "key": "job:{job_id}"}])
    assert [rule.slots for rule in both.rules] == [1]
    assert both.unique.key.render((3,), {}) == "job:3"
    period = TaskLimits.compile("proj.job", job, [{"period": 90}])
    assert period.rules == () and period.period.period == 90.0


def test_keys_share_the_names_hash_slot() -> None:
    tag = semaphore_key("job:7").split("}")[0]
    assert unique_key("job:7") == f"{tag}}}:u:job:7"
    assert period_key("job:7") == f"{tag}}}:p:job:7"


def test_already_queued_names_key_and_task() -> None:
    error = AlreadyQueued("job:7", "abc-123", "proj.job")
    assert (error.key, error.task_id, error.task_name) == ("job:7", "abc-123", "proj.job")
    assert "job:7" in str(error) and "abc-123" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.task_id, str(copy)) == (error.key, error.task_id, str(error))


def test_owned_lease_compare_and_delete(redis_client) -> None:
    mine = OwnedLease(redis_client, unique_key("k"), "k", "task-1", 5)
    theirs = OwnedLease(redis_client, unique_key("k"), "k", "task-2", 5)
    assert mine.take() is None
    assert theirs.take() == "task-1"
    assert mine.take() is None  # the same id takes it again
    assert not theirs.release() and not theirs.renew()
    assert mine.renew(60) and 55_000 < redis_client.pttl(unique_key("k")) <= 60_000
    assert mine.release() and not mine.release()
    assert theirs.once(1) is None
    owner, left = mine.once(1)
    assert owner == "task-2" and 0 < left <= 1
    assert theirs.once(30) is None and redis_client.pttl(unique_key("k")) <= 1000


def test_unique_send_fails_closed_when_the_lock_store_is_unreachable(closed_port: int) -> None:
    """The key cannot be checked: the send raises LockStoreUnavailable and nothing is
    published; with redislock_fail_open the task is sent without the check."""
    from celery_redislock import LockStoreUnavailable

    app = _app()
    app.conf.redislock_url = f"redis://127.0.0.1:{closed_port}/0"
    app.conf.redislock_transport_options = {}
    task = app.task(base=LimitedTask, name="proj.job", shared=False, lock_unique=True,
                    lock_key="job:{job_id}")(job)
    with pytest.raises(LockStoreUnavailable, match="job:7"):
        task.delay(7)
    app.conf.redislock_fail_open = True
    task._redislock_settings = None  # settings are read once per task
    assert task.delay(7).id


def test_unique_send_in_eager_mode_runs_at_once(redis_client) -> None:
    app = _app()
    app.conf.task_always_eager = True
    app.conf.redislock_client = redis_client
    ran = []

    def body(job_id):
        ran.append(job_id)

    task = app.task(base=LimitedTask, name="proj.eager", shared=False, lock_unique=True,
                    lock_key="job:{job_id}")(body)
    task.delay(1)
    task.delay(1)
    assert ran == [1, 1]  # nothing is queued in eager mode: nothing to deduplicate
    assert not redis_client.keys("*:u:*")
