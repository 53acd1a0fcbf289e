"""Building semaphore names from task arguments, and checking templates at definition."""

from __future__ import annotations

import pytest

from celery_redislock import LockConfigurationError, LockKeyError
from celery_redislock.engine.keys import KeyTemplate, check_prefix, rate_key, semaphore_key


def sync_customer(customer_id, full=False, *, region="eu"):
    pass


def with_kwargs(tenant, **extra):
    pass


def template(source, func=sync_customer):
    return KeyTemplate(source, func, owner="Task 'proj.sync'")


def test_positional_and_keyword_calls_give_one_name():
    key = template("customer:{customer_id}")
    names = {
        key.render((5,), {}),
        key.render((), {"customer_id": 5}),
        key.render((5, True), {}),
        key.render((5,), {"full": True, "region": "us"}),
    }
    assert names == {"customer:5"}


def test_defaults_are_applied():
    assert template("{customer_id}:{full}:{region}").render((7,), {}) == "7:False:eu"


def test_attribute_and_item_fields():
    key = template("c:{customer_id[id]}")
    assert key.render(({"id": 3},), {}) == "c:3"


def test_var_keyword_arguments_can_be_named():
    key = template("{tenant}/{shard}", with_kwargs)
    assert key.render(("acme",), {"shard": 2}) == "acme/2"
    with pytest.raises(LockKeyError, match=r"proj\.sync"):
        key.render(("acme",), {})


def test_no_template_uses_the_default_name():
    key = KeyTemplate(None, sync_customer, owner="Task 'proj.sync'", default="proj.sync")
    assert key.is_constant
    assert key.render((1,), {}) == "proj.sync"


def test_callable_key():
    key = template(lambda customer_id, **_: f"cust-{customer_id % 2}")
    assert key.render((5,), {}) == "cust-1"


def test_unknown_argument_is_named_in_the_error():
    with pytest.raises(LockConfigurationError) as caught:
        template("customer:{custmer_id}")
    message = str(caught.value)
    assert "proj.sync" in message and "custmer_id" in message and "customer_id" in message


@pytest.mark.parametrize("source", ["customer:{customer_id", "c:{}", "c:{0}", "{customer_id!z}"])
def test_malformed_templates_are_refused(source):
    with pytest.raises(LockConfigurationError, match=r"proj\.sync"):
        template(source)


def test_key_of_wrong_type_is_refused():
    with pytest.raises(LockConfigurationError, match="template string or a callable"):
        template(42)


def test_wrong_arguments_at_run_time_raise_lock_key_error():
    with pytest.raises(LockKeyError, match=r"proj\.sync"):
        template("customer:{customer_id}").render((), {"nope": 1})


def test_prefix_must_not_carry_a_hash_tag():
    assert check_prefix("app1:") == "app1:"
    with pytest.raises(LockConfigurationError, match="redislock_key_prefix"):
        check_prefix("{app}:")


def test_redis_keys_use_prefix_and_digest_tag():
    key = semaphore_key("customer:5", prefix="app1:")
    assert key.startswith("app1:{") and key.endswith("}:s:customer:5")
    assert rate_key("customer:5", prefix="app1:").endswith("}:r:customer:5")
    assert semaphore_key("customer:5") != semaphore_key("customer:6")
