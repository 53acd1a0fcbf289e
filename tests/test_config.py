"""The redislock_limits setting: plain tasks limited with no code change, precedence, checks."""

from __future__ import annotations

import pytest
from celery import Celery

import celery_redislock
from celery_redislock import LimitedTask, LockConfigurationError, Semaphore, check_limits
from celery_redislock.config.limits_setting import configuration_problems, matching_entry

from support import LOCK_DB, wait_until


def holders(client, name):
    return Semaphore(client, name).holders()


def test_plain_task_is_limited_by_config(celery_app, celery_worker, lock_client, deliveries):
    celery_app.conf.redislock_limits = {
        "tests.plain_*": {"slots": 1, "key": "plain:{n}", "retry_backoff": 0.02,
                           "retry_backoff_max": 0.05},
    }
    celery_redislock.install(celery_app)
    ran = []

    @celery_app.task(name="tests.plain_job", bind=True, shared=False)
    def plain_job(self, n):
        ran.append(n)
        return [self.request.redislock_lease.name, holders(lock_client, f"plain:{n}")]

    celery_worker.reload()
    assert plain_job.delay(1).get(timeout=10) == ["plain:1", 1]
    wait_until(lambda: holders(lock_client, "plain:1") == 0, 2, what="the slot to come back")
    # While the slot of plain:1 is held elsewhere, the task waits (parked), then runs.
    held = Semaphore(lock_client, "plain:1").acquire(blocking=False)
    result = plain_job.delay(n=1)
    wait_until(lambda: deliveries[result.id] >= 1, what="a refused delivery")
    assert ran == [1]
    Semaphore(lock_client, "plain:1").release(held)
    assert result.get(timeout=10) == ["plain:1", 1]


def test_rate_on_plain_task_spaces_starts(celery_app, celery_worker, lock_client):
    celery_app.conf.redislock_limits = {"tests.ticker": {"rate": "20/s", "burst": 0}}
    celery_redislock.install(celery_app)

    @celery_app.task(name="tests.ticker", shared=False, bind=True)
    def ticker(self):
        return self.request.redislock_lease.acquired_at_ms  # the admission's server time

    celery_worker.reload()
    starts = sorted(r.get(timeout=20) for r in [ticker.delay() for _ in range(10)])
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # 20/s: 50 ms apart, on the Redis server's clock (admission times in whole ms).
    assert min(gaps) >= 49, gaps


def test_config_entry_replaces_class_options(celery_app, celery_worker, lock_client):
    celery_app.conf.redislock_limits = {"tests.overridden": {"slots": 3, "key": "over"}}

    @celery_app.task(base=LimitedTask, lock_slots=1, name="tests.overridden", bind=True,
                     shared=False)
    def overridden(self):
        return [self.request.redislock_lease.name, self.task_limits().rules[0].slots]

    celery_worker.reload()
    assert overridden.delay().get(timeout=10) == ["over", 3]


def test_exact_name_beats_globs_and_longest_glob_wins():
    setting = {"proj.*": {"slots": 1}, "proj.tasks.*": {"slots": 2},
               "proj.tasks.report_x": {"slots": 3}}
    assert matching_entry(setting, "proj.tasks.report_x")[0] == "proj.tasks.report_x"
    assert matching_entry(setting, "proj.tasks.other")[0] == "proj.tasks.*"
    assert matching_entry(setting, "proj.web")[0] == "proj.*"
    assert matching_entry(setting, "other") is None


def test_django_namespace_setting_is_read():
    class DjangoSettings:
        CELERY_REDISLOCK_LIMITS = {"ns.task": {"slots": 2}}

    app = Celery("ns", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")

    @app.task(name="ns.task", shared=False)
    def task(x):
        pass

    celery_redislock.install(app)
    check_limits(app)
    assert app.tasks["ns.task"]._redislock_wrapped


def make_app(limits):
    app = Celery("checked", set_as_current=False)
    app.conf.redislock_limits = limits

    @app.task(name="proj.call_api", shared=False)
    def call_api(api_token, payload=None):
        pass

    @app.task(name="proj.charge", shared=False)
    def charge(merchant_id, amount):
        pass

    return app


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"proj.call_api": {"slotz": 1}}, "unknown field slotz (did you mean slots?)"),
        ({"proj.call_api": {"rate": "100/fortnight"}}, "is not a rate"),
        ({"proj.call_api": {"slots": 0}}, "slots must be a positive integer"),
        ({"proj.call_api": {"slots": 1, "key": "t:{token}"}}, "names argument 'token'"),
        ({"proj.call_api": {}}, "needs 'slots', 'rate' or both"),
        ({"proj.call_api": []}, "non-empty list"),
        ({"proj.call_api": {"slots": 1, "burst": 3}}, "'burst' is given without a 'rate'"),
        ({"proj.cal_api": {"slots": 1}},
         "matches no registered task (did you mean 'proj.call_api'"),
        ({"proj.charge": [{"slots": 1, "max_wait": 1}, {"rate": "1/s", "max_wait": 2}]},
         "max_wait is given twice"),
        ([("proj.charge", {"slots": 1})], "must map task names or globs"),
    ],
)
def test_bad_configuration_is_reported_naming_the_entry(limits, message):
    app = make_app(limits)
    with pytest.raises(LockConfigurationError) as caught:
        check_limits(app)
    assert message in str(caught.value)
    if isinstance(limits, dict):
        assert repr(next(iter(limits))) in str(caught.value)


def test_good_configuration_passes_the_check():
    app = make_app({
        "proj.call_api": {"rate": "100/m", "burst": 5, "key": "token:{api_token}"},
        "proj.ch*": [{"slots": 2, "key": "merchant:{merchant_id}"}, {"rate": "50/s"}],
    })
    check_limits(app)


def test_worker_refuses_to_start_with_bad_configuration(redis_server):
    from celery.contrib.testing.worker import start_worker
    from celery.exceptions import WorkerShutdown

    app = make_app({"proj.call_api": {"slots": -1}})
    app.conf.broker_url = f"redis://127.0.0.1:{redis_server.port}/1"
    app.conf.redislock_url = f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}"
    celery_redislock.install(app)
    with pytest.raises(WorkerShutdown), start_worker(app, perform_ping_check=False):
        pass
    # What the worker logged, one CRITICAL line per problem (tests/test_startup.py reads
    # them from a real worker's output).
    [problem] = configuration_problems(app)
    assert "proj.call_api" in problem and "slots must be a positive integer" in problem
