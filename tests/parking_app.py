"""The Celery app that the real workers of ``test_parking_line.py`` run.

Like :mod:`fault_app` (same URLs from the environment, the same records: ``runs:<id>``,
``peaks:<key>`` counted from inside the bodies with each process's identity), on the
parking line (``REDISLOCK_TEST_LINE`` may name ``redislock_line``; unset: ``"broker"``).
Further records:

``attempts:<id>:<retries>``  how many bodies ran for that attempt (``upstream``)
``forged``                   list: the tags of ``record`` bodies (a forged task's runs)
``refused``                  hash: task id -> how many times it was refused (or parked)
``refused_at``               hash: task id -> when it was first refused (server µs)

Test-only hooks, read at import:

* ``REDISLOCK_TEST_KILL_AT_PARK=<node>``: the first time worker ``<node>`` is about to
  acknowledge a run it ended without running (a refused run whose waiting or parked
  copy was published), it SIGKILLs its whole process group instead, once for the
  cluster (``killed`` in the record store);
* ``REDISLOCK_TEST_HOLD_AFTER_RELEASE=1``: a run whose id is in the record store's set
  ``hold-after-release`` (taken out of it, so once per id) stops after its release, in
  its pool process, before Celery stores its result or acknowledges it: it says so
  (``held``: task id -> pid) and waits for an entry in the list ``go:<id>`` (or its
  worker's death);
* ``REDISLOCK_TEST_KILL_BEFORE_PUBLISH=1``: a run whose id is in the record store's set
  ``kill-before-publish`` (taken out of it, so once per id), refused and about to publish
  its parked copy from the process that runs it (a gevent worker's greenlet, or a pool
  process that asks: ``pool_park.park_here``), says so (``killed-before-publish``: task
  id -> pid) and SIGKILLs its whole process group instead;
* ``REDISLOCK_TEST_UNSENT_MS``: ``pool_park.UNSENT_MS``, how long the lock store waits
  for the confirmation of such a publish;
* ``REDISLOCK_TEST_VISIBILITY``: the broker's visibility timeout (s, default 60);
* ``REDISLOCK_TEST_GATE``: ``redislock_gate`` (default ``"blocking"``);
* ``REDISLOCK_TEST_PARKING_ON_RABBITMQ``: the broker is the shared RabbitMQ (see
  :mod:`rabbit_app`), with a queue of the cluster's own (no direct queues).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Optional

from celery import Celery

from celery_redislock import LimitedTask
from celery_redislock.admin.control import pause_key_of
from celery_redislock.gate import gate, main_process
from celery_redislock.integration.signals import lock_contended, lock_released
from celery_redislock.pool import pool_park

from fault_app import fault_recorder
from rabbit_app import AMQP_URL, queue_name
from worker_app import BROKER_URL_ENV, LINE_ENV, AppUrls

KILL_ENV = "REDISLOCK_TEST_KILL_AT_PARK"
HOLD_ENV = "REDISLOCK_TEST_HOLD_AFTER_RELEASE"
KILL_BEFORE_PUBLISH_ENV = "REDISLOCK_TEST_KILL_BEFORE_PUBLISH"
#: The record store's set of the task ids killed before their publish.
KILL_BEFORE_PUBLISH_SET = "kill-before-publish"
UNSENT_ENV = "REDISLOCK_TEST_UNSENT_MS"
#: The record store's set of the task ids that stop after their release (``HOLD_ENV``).
HOLD_SET = "hold-after-release"
VISIBILITY_ENV = "REDISLOCK_TEST_VISIBILITY"
GATE_ENV = "REDISLOCK_TEST_GATE"
RABBIT_ENV = "REDISLOCK_TEST_PARKING_ON_RABBITMQ"

SLOTS = "parking_app.slots"
ONE = "parking_app.one"
UPSTREAM = "parking_app.upstream"
RECORD = "parking_app.record"
LATE = "parking_app.late"
TENANTS = "parking_app.tenants"

SLOTS_PREFIX = "slots:"
ONE_PREFIX = "one:"
API_PREFIX = "api:"
LATE_PREFIX = "late:"
SLOT_COUNT = 2
#: Every limit's lease (the grace after a loss of the lock store's data is the longest).
LEASE = 4.0
#: ``tenants``: one at a time per tenant, two at a time over all tenants.
TENANT_LIMITS = [{"slots": 1, "key": "tenant:{tenant}", "lease": LEASE},
                 {"slots": 2, "key": "tenants", "lease": LEASE}]
#: Waiting copies on today's line come back quickly (the hand-off is the fast path).
RETRY = {"lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.3}


def create_app(urls: AppUrls) -> Celery:
    """A Celery app on ``urls`` with this module's tasks, on the environment's line."""
    rabbit = bool(os.environ.get(RABBIT_ENV))
    app = Celery("parking_app", broker=AMQP_URL if rabbit else urls.broker,
                 backend=urls.backend, set_as_current=False)
    visibility = float(os.environ.get(VISIBILITY_ENV, "60"))
    app.conf.update(redislock_url=urls.lock, broker_connection_retry_on_startup=True,
                    worker_prefetch_multiplier=1, worker_direct=not rabbit,
                    broker_transport_options={"visibility_timeout": visibility},
                    redislock_limits={TENANTS: TENANT_LIMITS})
    if rabbit:
        app.conf.task_default_queue = queue_name(urls).replace("test", "parking")
    app.conf.redislock_line = os.environ.get(LINE_ENV, "broker")
    app.conf.redislock_gate = os.environ.get(GATE_ENV, "blocking")

    def record() -> Any:
        return fault_recorder(urls.record)

    @app.task(base=LimitedTask, bind=True, shared=False, name=SLOTS, lock_slots=SLOT_COUNT,
              lock_key=SLOTS_PREFIX + "{key}", lock_lease=LEASE, **RETRY)
    def slots(self: Any, seconds: float, key: str = "a") -> str:
        """Two at a time per key."""
        return str(record().work(self, [SLOTS_PREFIX + key], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=ONE, lock_slots=1,
              lock_key=ONE_PREFIX + "{key}", lock_lease=LEASE, **RETRY)
    def one(self: Any, seconds: float, key: str = "a", until: Optional[str] = None) -> str:
        """One at a time per key (``until``: see :meth:`fault_app.FaultRecorder.work`)."""
        return str(record().work(self, [ONE_PREFIX + key], seconds, until=until))

    @app.task(base=LimitedTask, bind=True, shared=False, name=LATE, lock_slots=1,
              lock_key=LATE_PREFIX + "{key}", lock_lease=LEASE, acks_late=True, **RETRY)
    def late(self: Any, seconds: float, key: str = "a") -> str:
        """One at a time per key, acknowledged after the body."""
        return str(record().work(self, [LATE_PREFIX + key], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=TENANTS, lock_lease=LEASE,
              **RETRY)
    def tenants(self: Any, seconds: float, tenant: str) -> str:
        """Two limits (``redislock_limits``): a slot per tenant, two over all."""
        return str(record().work(self, [f"tenant:{tenant}", "tenants"], seconds))

    @app.task(base=LimitedTask, bind=True, shared=False, name=UPSTREAM, lock_slots=1,
              lock_key=API_PREFIX + "{key}", lock_lease=LEASE, max_retries=3, **RETRY)
    def upstream(self: Any, key: str = "a") -> str:
        """An upstream that answers 429 to every first attempt: README's pattern."""
        retries = self.request.retries or 0
        record().client.incr(f"attempts:{self.request.id}:{retries}")
        if retries == 0:
            pause_key_of(self, key, seconds=0.5, keep_longer=True)
            raise self.retry(countdown=0.5)
        return str(record().work(self, [API_PREFIX + key], 0.05))

    @app.task(shared=False, name=RECORD)
    def record_tag(tag: str = "forged") -> str:
        """Not limited: what a forged lock-store entry would name."""
        record().client.rpush("forged", tag)
        return tag

    def on_refused(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
        if (getattr(sender, "app", None) is app and task_id
                and record().client.hincrby("refused", task_id, 1) == 1):
            record().stamp("refused_at", task_id)  # its first refusal (server µs)

    lock_contended.connect(on_refused, weak=False)
    _kill_at_park(record)
    _kill_before_publish(record)
    if os.environ.get(HOLD_ENV):
        _hold_after_release(app, record)
    return app


def _hold_after_release(app: Celery, record: Any) -> None:
    """The hook of ``REDISLOCK_TEST_HOLD_AFTER_RELEASE`` (see the module doc)."""

    def hold(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
        client = record().client
        if getattr(sender, "app", None) is app and task_id and client.srem(HOLD_SET, task_id):
            client.hset("held", task_id, os.getpid())
            client.blpop(f"go:{task_id}", timeout=120)

    lock_released.connect(hold, weak=False)


def _kill_at_park(record: Any) -> None:
    """The hook of ``REDISLOCK_TEST_KILL_AT_PARK`` (see the module doc)."""
    node = os.environ.get(KILL_ENV)
    if not node:
        return
    acknowledge = main_process.end_unrun

    def end_unrun(request: Any) -> None:
        hostname = str(getattr(request, "hostname", "") or "")
        if hostname.split("@", 1)[0] == node and record().client.setnx("killed", request.id):
            os.killpg(os.getpgid(0), signal.SIGKILL)
        acknowledge(request)

    gate.end_unrun = end_unrun  # type: ignore[assignment]
    main_process.end_unrun = end_unrun  # type: ignore[assignment]  (after a park)


def _kill_before_publish(record: Any) -> None:
    """The hooks of ``REDISLOCK_TEST_KILL_BEFORE_PUBLISH`` and ``REDISLOCK_TEST_UNSENT_MS``
    (see the module doc)."""
    if os.environ.get(UNSENT_ENV):
        pool_park.UNSENT_MS = int(os.environ[UNSENT_ENV])  # type: ignore[misc]
    if not os.environ.get(KILL_BEFORE_PUBLISH_ENV):
        return
    publish = pool_park.park_here

    def park_here(task: Any, request: Any, *rest: Any) -> bool:
        client = record().client
        if client.srem(KILL_BEFORE_PUBLISH_SET, request.id):
            client.hset("killed-before-publish", request.id, os.getpid())
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return publish(task, request, *rest)

    pool_park.park_here = park_here  # type: ignore[assignment]


#: The app of the worker processes (see :mod:`fault_app`).
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
