"""Every bad limit definition is refused when the task is defined, naming every problem;
keys built from arguments never collide; callable keys and hashed values work in real runs.

Only the public API is used: ``app.task(base=LimitedTask, ...)``, ``Rate``,
``check_limits``; the runs go through ``task.apply()`` against the private lock store.
"""

from __future__ import annotations

import hashlib

import pytest
from celery import Celery

from celery_redislock import (
    LimitedTask,
    LockConfigurationError,
    Rate,
    SingletonTask,
    check_limits,
)

INF, NAN = float("inf"), float("nan")


def define(options, base=LimitedTask):
    """Define a task with ``options`` on a fresh app, as a user would."""
    app = Celery("definitions", set_as_current=False)

    def call_api(tenant, user, api_token="t", n=1, w=3):
        pass

    task = app.task(base=base, shared=False, name="proj.call_api", **options)(call_api)
    app.finalize()
    task.task_limits()  # what delay(), apply_async() and a run raise with
    return task


def refusal(options, base=LimitedTask) -> str:
    with pytest.raises(LockConfigurationError) as caught:
        define(options, base)
    message = str(caught.value)
    assert "proj.call_api" in message
    return message


LEASE_RANGE = "lock_lease must be a positive number of seconds, from 0.1 to 86400"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock_lease": 1e16}, LEASE_RANGE + ", not 1e+16"),
        ({"lock_lease": 1e300}, LEASE_RANGE + ", not 1e+300"),
        ({"lock_lease": INF}, LEASE_RANGE + ", not inf"),
        ({"lock_lease": NAN}, LEASE_RANGE + ", not nan"),
        ({"lock_lease": 0.001}, LEASE_RANGE + ", not 0.001"),
        ({"lock_slots": 10**400},
         "lock_slots must be a positive integer, from 1 to 1000000, not 1000"),
        ({"lock_retry_backoff_max": NAN},
         "lock_retry_backoff_max must be a number of seconds, from 0.05 to 3600, not nan"),
        ({"lock_retry_backoff_max": 1e9},
         "lock_retry_backoff_max must be a number of seconds, from 0.05 to 3600, not 1000000000.0"),
        ({"lock_retry_backoff": INF},
         "lock_retry_backoff must be a number of seconds, from 0 to 3600, not inf"),
        ({"lock_max_wait": INF},
         "lock_max_wait must be a number of seconds, from 0 to 2592000, or None, not inf"),
        ({"lock_max_wait": NAN},
         "lock_max_wait must be a number of seconds, from 0 to 2592000, or None, not nan"),
        ({"lock_rate": "1/s", "lock_burst": 10**400},
         "lock_burst must be a whole number, from 0 to 1000000, not 1000"),
    ],
)
def test_numbers_out_of_range_are_refused(options, message):
    assert message in refusal(options)


@pytest.mark.parametrize(
    "text", ["5/ms", "10/hs", "1/mss", "1/sex", "1/hourss", "1/fortnight", "1/S", "1/10",
             "5/0s", "0/s", "1/0.0000001s", "0.00001/d", "1e3/s", "nan/s", "inf/s"],
)
def test_rates_outside_the_documented_units_and_range_are_refused(text):
    message = refusal({"lock_rate": text})
    assert f"lock_rate {text!r}" in message
    with pytest.raises(LockConfigurationError, match="rate"):
        Rate.parse(text)


@pytest.mark.parametrize(
    ("unit", "seconds"),
    [(spelling, seconds) for seconds, spellings in [
        (1, ["s", "sec", "secs", "second", "seconds"]),
        (60, ["m", "min", "mins", "minute", "minutes"]),
        (3600, ["h", "hr", "hrs", "hour", "hours"]),
        (86400, ["d", "day", "days"]),
    ] for spelling in spellings],
)
def test_every_documented_spelling_of_a_unit_is_read(unit, seconds):
    assert Rate.parse(f"5/{unit}").period == seconds
    assert Rate.parse(f"5 / 10 {unit}").period == 10 * seconds
    assert define({"lock_rate": f"5/10{unit}"}).task_limits().rules[0].rate.period == 10 * seconds


def test_the_ends_of_every_range_are_accepted():
    define({"lock_lease": 0.1, "lock_slots": 1_000_000, "lock_retry_backoff": 0,
            "lock_retry_backoff_max": 3600, "lock_max_wait": 0})
    define({"lock_lease": 86400, "lock_rate": "1000000/s", "lock_burst": 1_000_000,
            "lock_max_wait": 30 * 86400})
    define({"lock_rate": "1/d", "lock_burst": 0})


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("{n:>{w}}", "lock_key '{n:>{w}}' puts a field inside the format spec of {n}"),
        ("{n:>{nope}}", "lock_key '{n:>{nope}}' puts a field inside the format spec of {n}"),
        ("{tenant:zz}", "lock_key '{tenant:zz}' has a format spec ':zz' that formats no value"),
        ("{n:>{w!z}}", "lock_key '{n:>{w!z}}' puts a field inside the format spec of {n}"),
        ("{tenant!z}", "lock_key '{tenant!z}' has an unknown conversion !z"),
        ("{tenant}{user}", "lock_key '{tenant}{user}' puts {tenant} and {user} side by side"),
        ("{tenant}-{user}", "lock_key '{tenant}-{user}' puts {tenant} and {user} side by side"),
        ("{tenant:hashed}", "has a format spec ':hashed' that formats no value"),
    ],
)
def test_key_templates_are_checked_entirely_at_definition(key, message):
    assert message in refusal({"lock_key": key})


def test_a_callable_key_must_take_the_task_arguments_it_needs():
    message = refusal({"lock_key": lambda account_id: account_id})
    assert "lock_key callable needs argument 'account_id', which the task does not take" in message
    assert "tenant, user, api_token, n, w" in message


@pytest.mark.parametrize(
    ("options", "message", "base"),
    [
        ({"lock_slot": 2}, "unknown option lock_slot (did you mean lock_slots?)", LimitedTask),
        ({"lock_kye": "x"}, "unknown option lock_kye (did you mean lock_key?)", SingletonTask),
        ({"lock_leases": 5}, "unknown option lock_leases (did you mean lock_lease?)", LimitedTask),
        ({"lock_zzz": 5}, "unknown option lock_zzz (known: lock_slots, lock_rate", LimitedTask),
    ],
)
def test_misspelt_options_are_refused_with_a_hint(options, message, base):
    assert message in refusal(options, base)


def test_every_problem_of_a_task_is_listed_at_once():
    message = refusal({"lock_slots": 0, "lock_lease": INF, "lock_rate": "5/ms",
                       "lock_slot": 2, "lock_key": "{tenant}{user}",
                       "lock_retry_backoff_max": NAN})
    for part in ["lock_slots must be", "lock_lease must be", "lock_rate '5/ms'",
                 "unknown option lock_slot", "side by side", "lock_retry_backoff_max must be"]:
        assert part in message, part


def test_check_limits_lists_every_problem_of_every_entry():
    app = Celery("checked", set_as_current=False)
    app.conf.redislock_limits = {
        "proj.call_api": [{"slotz": 1, "lease": 1e16, "rate": "10/hs"},
                          {"slots": 10**400, "key": "{api_token:>{n}}"}],
        "proj.other": {"retry_backoff_max": NAN, "rate": "5/ms", "max_wiat": 3},
    }

    @app.task(name="proj.call_api", shared=False)
    def call_api(api_token, n=1):
        pass

    @app.task(name="proj.other", shared=False)
    def other():
        pass

    with pytest.raises(LockConfigurationError) as caught:
        check_limits(app)
    message = str(caught.value)
    for part in ["unknown field slotz (did you mean slots?)", "lease must be a positive number",
                 "rate '10/hs'", "slots must be a positive integer", "format spec of {api_token}",
                 "retry_backoff_max must be", "rate '5/ms'",
                 "unknown field max_wiat (did you mean max_wait?)"]:
        assert part in message, part
    assert message.count("\n  - ") >= 8


# -- keys built from arguments, in real runs ----------------------------------------------


def lease_name_task(app, key, name):
    def call_api(self, tenant, user="-", api_token="t", payload=None):
        return self.request.redislock_lease.name

    return app.task(base=LimitedTask, bind=True, shared=False, lock_key=key,
                    name=f"proj.{name}")(call_api)


def test_distinct_arguments_never_share_a_key(celery_app, lock_client):
    task = lease_name_task(celery_app, "t:{tenant}:{user}", "escaped")
    one = task.apply(("acme:bob", "x")).get()
    two = task.apply(("acme", "bob:x")).get()
    assert one == "t:acme%3Abob:x" and two == "t:acme:bob%3Ax"
    assert task.apply(("50%", "{x}/y")).get() == "t:50%25:%7Bx%7D%2Fy"
    assert task.apply(("50%25", "")).get() == "t:50%2525:"
    assert task.apply(("Zoë d'Arc", 7)).get() == "t:Zoë d'Arc:7"  # readable otherwise


def test_a_callable_key_gets_the_arguments_bound_by_name(celery_app, lock_client):
    task = lease_name_task(celery_app, lambda api_token, **_: api_token.split(":")[0], "by_token")
    assert task.apply(("acme",), {"api_token": "k1:secret"}).get() == "k1"
    assert task.apply(kwargs={"tenant": "acme", "api_token": "k2:x", "payload": 1}).get() == "k2"
    assert task.apply(("acme", "bob")).get() == "t"  # the default of api_token is passed
    only = lease_name_task(celery_app, lambda tenant, user: f"{tenant}/{user}", "by_user")
    assert only.apply(("acme", "bob"), {"payload": 3}).get() == "acme/bob"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_a_hashed_field_keeps_secrets_out_of_redis_keys(celery_app, lock_client):
    seen_keys = []

    @celery_app.task(base=LimitedTask, bind=True, shared=False, name="proj.secret",
                     lock_key="token:{api_token:hash}")
    def call_api(self, api_token, payload=None):
        seen_keys.extend(key.decode() for key in lock_client.keys("*"))
        return self.request.redislock_lease.name

    assert call_api.apply(("s3cr3t-token-1",)).get() == "token:" + digest("s3cr3t-token-1")
    assert call_api.apply(kwargs={"api_token": "s3cr3t-token-2"}).get() == (
        "token:" + digest("s3cr3t-token-2"))
    assert seen_keys and not any("s3cr3t" in key for key in seen_keys)
    assert all(len(digest(f"tok-{i}")) == 16 for i in range(3))


def test_a_callable_key_works_in_a_worker(celery_app, celery_worker, lock_client):
    @celery_app.task(base=LimitedTask, bind=True, shared=False, name="proj.by_tenant",
                     lock_key=lambda tenant, **_: f"tenant:{tenant.split('/')[0]}")
    def by_tenant(self, tenant, payload=None):
        return self.request.redislock_lease.name

    celery_worker.reload()
    assert by_tenant.delay("acme/eu", payload=1).get(timeout=10) == "tenant:acme"
    assert by_tenant.delay(tenant="bolt/us").get(timeout=10) == "tenant:bolt"
