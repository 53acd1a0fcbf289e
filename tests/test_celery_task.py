"""LimitedTask and SingletonTask in a real (in-process) Celery worker, with a real Redis.

Uses pytest-celery's classic ``celery_app`` / ``celery_worker`` fixtures: the worker runs
the solo pool in a thread of this process, against a private redis-server that serves as
broker and lock store (one database each); results stay in this process's memory.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from celery import Celery, chain
from celery.exceptions import Ignore, Reject

from celery_redislock import (
    Lease,
    LimitedTask,
    LockConfigurationError,
    LockStoreUnavailable,
    LockWaitTimeout,
    Semaphore,
    SingletonTask,
    check_limits,
)
from celery_redislock.engine.admission import SlotLimit, admit
from celery_redislock.integration.signals import lock_store_error

from support import FAST_RETRY, INCARNATION, wait_until


def holders(lock_client, name):
    return Semaphore(lock_client, name).holders()


def test_body_runs_holding_a_slot_which_is_released(celery_app, celery_worker, lock_client):
    @celery_app.task(base=LimitedTask, lock_slots=2, bind=True, shared=False)
    def crawl(self, url):
        lease = self.request.redislock_lease
        return [url, holders(lock_client, self.name), lease.fence > 0]

    celery_worker.reload()
    assert crawl.delay("a").get(timeout=10) == ["a", 1, True]
    wait_until(lambda: holders(lock_client, crawl.name) == 0, 2, what="the slot to come back")
    assert all(0 < lock_client.pttl(key) <= 60_000 for key in lock_client.keys("*")
               if key != INCARNATION)


def test_contention_neither_uses_retry_budget_nor_shows_in_retries(
    celery_app, celery_worker, lock_client, deliveries
):
    own_retries_seen = []

    @celery_app.task(base=LimitedTask, lock_key="budget", bind=True, max_retries=3,
                     shared=False, **FAST_RETRY)
    def patient(self):
        own_retries_seen.append(self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=0)  # the task's own retry logic still works
        return self.request.retries

    celery_worker.reload()
    blocker = Semaphore(lock_client, "budget", slots=1, lease=30)
    held = blocker.acquire(blocking=False)
    result = patient.delay()
    wait_until(lambda: deliveries[result.id] >= 1, what="the run to be refused (it parks)")
    time.sleep(1.0)  # parked: it waits, and its body does not run, however long
    assert own_retries_seen == []  # the body never ran while the slot was taken
    blocker.release(held)
    assert result.get(timeout=10) == 1
    assert own_retries_seen == [0, 1]
    wait_until(lambda: holders(lock_client, "budget") == 0, 2, what="the slot to come back")


def test_own_retry_after_a_wait_starts_a_fresh_wait(celery_app, celery_worker, lock_client,
                                                     deliveries):
    """The wait that ended when the run was admitted does not count against the retry."""
    waits = []

    @celery_app.task(base=LimitedTask, lock_key="fresh", bind=True, lock_max_wait=5,
                     shared=False, **FAST_RETRY)
    def flaky(self):
        waits.append((self.request.headers or {}).get("redislock_wait"))
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return self.request.retries

    celery_worker.reload()
    held = Semaphore(lock_client, "fresh").acquire(blocking=False)
    result = flaky.delay()
    wait_until(lambda: deliveries[result.id] >= 1, what="a contended delivery")  # parked
    Semaphore(lock_client, "fresh").release(held)
    assert result.get(timeout=10) == 1
    assert waits == [None, None]


def test_a_run_nobody_hears_of_frees_its_slot_soon_after(celery_app, celery_worker,
                                                         lock_client):
    """No result and nothing chained: the release may go with the worker's next request
    to the lock store; with none coming, it still goes out within moments."""
    ran = threading.Event()

    @celery_app.task(base=LimitedTask, lock_slots=2, ignore_result=True, shared=False)
    def quiet():
        ran.set()

    celery_worker.reload()
    quiet.delay()
    assert ran.wait(10)
    wait_until(lambda: holders(lock_client, quiet.name) == 0, timeout=2,
               what="the slot to come back")


def test_a_next_step_that_finds_the_slot_taken_is_handed_it(celery_app, celery_worker,
                                                             lock_client):
    """A run that stores a result and has a next step also leaves its release to go with
    its thread's next request to the lock store. Here the next step runs in the same
    thread (a solo worker), whose admission carries that release: the semaphore, full
    but for the first step's slot (the first step took the other one by hand), has its
    slot back before the step asks, in the same write (see test_workers.py for a next
    step in another process, which is handed the slot)."""
    @celery_app.task(base=LimitedTask, lock_slots=2, lock_key="steps", shared=False)
    def first():
        blocker = admit(lock_client, [SlotLimit("steps", 2, "redislock:")], lease=30)
        assert isinstance(blocker, Lease)
        return 1

    @celery_app.task(base=LimitedTask, lock_slots=2, lock_key="steps", shared=False,
                     lock_retry_backoff=5.0, bind=True)
    def second(self, value):
        return value + 1

    celery_worker.reload()
    started = time.monotonic()
    value = chain(first.s(), second.s()).delay().get(timeout=10)
    assert value == 2
    assert time.monotonic() - started < 3.0, "the next step waited for its countdown"
    assert holders(lock_client, "steps") == 1  # the blocker's slot; the steps' came back


def test_released_when_the_body_fails(celery_app, celery_worker, lock_client):
    @celery_app.task(base=SingletonTask, shared=False)
    def broken():
        raise ValueError("boom")

    celery_worker.reload()
    for _ in range(3):  # would wait forever on the second call if the slot leaked
        with pytest.raises(ValueError, match="boom"):
            broken.delay().get(timeout=10)
    wait_until(lambda: holders(lock_client, broken.name) == 0, 2, what="the slot to come back")


@pytest.mark.parametrize("ending", [Ignore, lambda: Reject("no", requeue=False)])
def test_released_when_the_body_ignores_or_rejects(celery_app, celery_worker, lock_client,
                                                   ending):
    ran = threading.Event()

    @celery_app.task(base=LimitedTask, lock_key="ends", shared=False)
    def ends():
        ran.set()
        raise ending()

    @celery_app.task(base=LimitedTask, lock_key="ends", shared=False, **FAST_RETRY)
    def after():
        return "ran"

    celery_worker.reload()
    ends.delay()
    assert ran.wait(10)
    wait_until(lambda: holders(lock_client, "ends") == 0, what="slot released")
    assert after.delay().get(timeout=10) == "ran"


def test_per_key_limit_binds_arguments_by_name(celery_app, celery_worker, lock_client):
    @celery_app.task(base=LimitedTask, lock_key="customer:{customer_id}", bind=True,
                     shared=False)
    def sync_customer(self, customer_id, full=False):
        return self.request.redislock_lease.name

    celery_worker.reload()
    assert sync_customer.delay(5).get(timeout=10) == "customer:5"
    assert sync_customer.delay(customer_id=5, full=True).get(timeout=10) == "customer:5"


def test_gives_up_after_lock_max_wait(celery_app, celery_worker, lock_client):
    @celery_app.task(base=LimitedTask, lock_key="max-wait", lock_max_wait=0.3,
                     shared=False, **FAST_RETRY)
    def impatient():
        return "ran"

    celery_worker.reload()
    held = Semaphore(lock_client, "max-wait").acquire(blocking=False)
    started = time.monotonic()
    with pytest.raises(LockWaitTimeout, match="max-wait"):
        impatient.delay().get(timeout=10)
    assert time.monotonic() - started >= 0.3
    Semaphore(lock_client, "max-wait").release(held)


def test_unreachable_lock_store_fails_closed(celery_app, celery_worker, own_redis_server,
                                             deliveries):
    """With the lock store down, a run waits, held in the worker's main process as one
    message (never sent back), and never runs unlimited nor vanishes."""
    celery_app.conf.redislock_url = own_redis_server.url
    ran = threading.Event()

    @celery_app.task(base=LimitedTask, shared=False, **FAST_RETRY)
    def guarded():
        ran.set()
        return "ran"

    errors = []

    def store_error(task_id=None, **_):
        errors.append(task_id)

    lock_store_error.connect(store_error, weak=False)
    celery_worker.reload()
    own_redis_server.stop()
    try:
        result = guarded.delay()
        # Held in the worker (one message, unacknowledged), asking again every half
        # second: the store error is said, and the run is neither run nor sent back.
        wait_until(lambda: result.id in errors, what="a store error while Redis is down")
        assert not ran.is_set()
        own_redis_server.start()
        assert result.get(timeout=15) == "ran"
        assert deliveries[result.id] == 1  # its run; never refused, never sent back
    finally:
        lock_store_error.disconnect(store_error)


def test_eager_apply_takes_a_slot_and_waits_for_one(celery_app, lock_client):
    # A wait of 1 s: the held slot given back 0.1 s into the third call's wait comes back
    # within it, also when a loaded machine delays the timer's thread.
    @celery_app.task(base=LimitedTask, lock_key="eager", bind=True, lock_max_wait=1.0,
                     shared=False)
    def eager(self):
        return holders(lock_client, "eager")

    assert eager.apply().get() == 1
    held = Semaphore(lock_client, "eager").acquire(blocking=False)
    with pytest.raises(LockWaitTimeout, match="eager"):
        eager.apply().get()
    threading.Timer(0.1, Semaphore(lock_client, "eager").release, args=(held,)).start()
    assert eager.apply().get() == 1  # the held slot comes back within the wait


def test_switched_off_and_direct_calls_never_touch_redis():
    app = Celery("offline", set_as_current=False)
    app.conf.redislock_url = "redis://127.0.0.1:1/0"  # nothing listens there
    app.conf.task_always_eager = True

    @app.task(base=LimitedTask, lock_slots=1, shared=False)
    def plain(x):
        return x * 2

    assert plain(21) == 42  # a direct call is a function call: no limit
    with pytest.raises(LockStoreUnavailable):
        plain.delay(1).get()
    app.conf.redislock_enabled = False  # for unit tests: limits off, Redis never called

    @app.task(base=LimitedTask, lock_slots=1, shared=False)
    def unlimited(x):
        return x * 2

    assert unlimited.delay(2).get() == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock_slots": 0}, "lock_slots must be a positive integer"),
        ({"lock_slots": "2"}, "lock_slots must be a positive integer"),
        ({"lock_key": "c:{nope}"}, "names argument 'nope'"),
        ({"lock_key": "c:{customer_id"}, "not a valid template"),
        ({"lock_lease": -1}, "lock_lease must be a positive number"),
        ({"lock_max_wait": "soon"}, "lock_max_wait must be a number"),
    ],
)
def test_bad_options_fail_when_the_task_is_defined(options, message):
    app = Celery("definitions", set_as_current=False)

    def sync_customer(customer_id):
        pass

    task = app.task(base=LimitedTask, shared=False, name="proj.sync", **options)(sync_customer)
    app.finalize()  # the app's other tasks are not broken by this one
    with pytest.raises(LockConfigurationError, match=message) as caught:
        task.delay("c1")
    assert "proj.sync" in str(caught.value)
    assert isinstance(task.apply(("c1",)).result, LockConfigurationError)
    with pytest.raises(LockConfigurationError, match=message):
        check_limits(app)


def test_an_eager_run_that_waits_says_so_once(celery_app, lock_client, caplog):
    """An eager run takes the lock store's real slots: with every slot taken it waits in
    the caller, and says so once, at WARNING, with how long it may wait."""
    @celery_app.task(base=LimitedTask, lock_key="eager-said", lock_max_wait=0.5,
                     shared=False)
    def eager_said():
        return "ran"

    held = Semaphore(lock_client, "eager-said").acquire(blocking=False)
    with caplog.at_level(logging.DEBUG, logger="celery_redislock"), \
            pytest.raises(LockWaitTimeout):
        eager_said.apply().get()
    said = [record for record in caplog.records if "eager run" in record.getMessage()]
    assert len(said) == 1, [record.getMessage() for record in caplog.records]
    assert said[0].levelname == "WARNING"
    assert (f"eager run of task {eager_said.name} (apply() or task_always_eager) found "
            "another run of 'eager-said' under way") in said[0].getMessage()
    assert "real slots" in said[0].getMessage()
    assert "at most 0.5 s (lock_max_wait)" in said[0].getMessage()
    Semaphore(lock_client, "eager-said").release(held)


def test_singleton_refuses_more_slots():
    app = Celery("singleton", set_as_current=False)

    def rebuild_index():
        pass

    task = app.task(base=SingletonTask, lock_slots=2, shared=False, name="x")(rebuild_index)
    with pytest.raises(LockConfigurationError, match="exactly one slot"):
        task.delay()


def test_signals_report_contention_acquire_and_release(celery_app, celery_worker, lock_client):
    from celery_redislock.integration import signals

    seen = []

    def record(signal_name):
        def receiver(sender=None, **kwargs):
            seen.append((signal_name, sender.name, kwargs))
        return receiver

    receivers = {name: record(name) for name in
                 ("lock_acquired", "lock_contended", "lock_released")}
    for name, receiver in receivers.items():
        getattr(signals, name).connect(receiver, weak=False)
    try:
        @celery_app.task(base=LimitedTask, lock_key="signalled", name="tests.signalled",
                         shared=False, **FAST_RETRY)
        def signalled():
            return "ran"

        celery_worker.reload()
        held = Semaphore(lock_client, "signalled").acquire(blocking=False)
        result = signalled.delay()
        wait_until(lambda: any(name == "lock_contended" for name, _, _ in seen),
                   what="a lock_contended signal")
        Semaphore(lock_client, "signalled").release(held)
        assert result.get(timeout=10) == "ran"
        wait_until(lambda: any(name == "lock_released" for name, _, _ in seen),
                   what="a lock_released signal")
    finally:
        for name, receiver in receivers.items():
            getattr(signals, name).disconnect(receiver)

    by_name = {name: kwargs for name, _, kwargs in seen}
    assert {sender for _, sender, _ in seen} == {"tests.signalled"}
    assert by_name["lock_contended"]["key"] == "signalled"
    assert 0 <= by_name["lock_contended"]["countdown"] <= 0.05  # 0: parked, no countdown
    assert by_name["lock_acquired"]["waited"] > 0
    assert by_name["lock_acquired"]["lease"].name == "signalled"
    assert by_name["lock_released"]["held"] >= 0
    assert by_name["lock_released"]["task_id"] == result.id


def test_fail_open_runs_without_a_slot_when_the_lock_store_is_down(
    celery_app, celery_worker, own_redis_server
):
    """redislock_fail_open=True: with the lock store down, the task runs at once, without
    a slot (no lease), and says so in the log."""
    celery_app.conf.redislock_url = own_redis_server.url
    celery_app.conf.redislock_fail_open = True

    @celery_app.task(base=LimitedTask, bind=True, shared=False)
    def careless(self):
        return getattr(self.request, "redislock_lease", None) is None

    celery_worker.reload()
    own_redis_server.stop()
    assert careless.delay().get(timeout=10) is True


def test_a_run_waits_for_its_rate_start_in_the_worker_within_a_quarter_of_its_time_limit():
    """A run whose start is near waits for it in the worker process, at most 0.5 s, and
    at most a quarter of any time limit of the run (its clock runs while it waits)."""
    from types import SimpleNamespace

    from celery_redislock.pool.attempt import short_wait_of

    plain = SimpleNamespace(time_limit=None, soft_time_limit=None)
    assert short_wait_of(plain, SimpleNamespace(timelimit=(None, None))) == 0.5
    assert short_wait_of(plain, SimpleNamespace(timelimit=(1.0, None))) == 0.25
    soft = SimpleNamespace(time_limit=None, soft_time_limit=0.4)
    assert short_wait_of(soft, SimpleNamespace(timelimit=None)) == pytest.approx(0.1)
