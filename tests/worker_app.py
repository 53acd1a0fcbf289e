"""The Celery app that the real worker processes of ``test_workers.py`` run.

The workers start it with ``celery -A worker_app worker``; the URLs of their broker, result
backend, lock store and record store come from the environment (see :class:`AppUrls`).
The test process builds its own instance with :func:`create_app` and the same URLs, so
both sides share one set of task definitions.

Every task body records what it sees in the record store, a Redis database of its own:

``running:<key>``   how many bodies of limit key ``<key>`` run now (INCR at start, DECR at end)
``peaks:<key>``     list of ``running:<key>`` as each body started: its maximum is the
                    highest concurrency ever reached for that key
``runs:<task id>``  how many times a body ran for that task id (must end at exactly 1)
``started``         hash: task id -> Redis server time (microseconds) when the body started
``ended``           hash: task id -> Redis server time (microseconds) when the body ended

All of one step is a single Lua script, so it is atomic and timed by the Redis server's
clock, which every process shares.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import redis
from celery import Celery
from celery.signals import task_postrun, task_prerun, task_revoked

from celery_redislock import LimitedTask

BROKER_URL_ENV = "REDISLOCK_TEST_BROKER_URL"
BACKEND_URL_ENV = "REDISLOCK_TEST_BACKEND_URL"
LOCK_URL_ENV = "REDISLOCK_TEST_LOCK_URL"
RECORD_URL_ENV = "REDISLOCK_TEST_RECORD_URL"
#: A worker's ``redislock_line`` (unset: the package's default, ``"broker"``, its only
#: value; see :func:`line_from_environment`).
LINE_ENV = "REDISLOCK_TEST_LINE"
#: Set to ``"0"``: the workers run with ``redislock_hand_on`` off (unset: the default, on).
HAND_ON_ENV = "REDISLOCK_TEST_HAND_ON"

#: Limit keys under which the tasks below record their runs.
LIMITED_KEY = "limited"
CUSTOMERS_KEY = "customers"
SHORT_LEASE_KEY = "short-lease"

#: Names of the tasks, as both the workers and the test process register them.
LIMITED_SLEEP = "worker_app.limited_sleep"
SYNC_CUSTOMER = "worker_app.sync_customer"
SHORT_LEASE_SLEEP = "worker_app.short_lease_sleep"
HANDOFF_SLEEP = "worker_app.handoff_sleep"
#: Like HANDOFF_SLEEP, with a fallback countdown of at least 2.5 s: a slot that waited for
#: a countdown instead of being handed over shows as a stretch that long with a slot free.
HANDOFF_PATIENT = "worker_app.handoff_patient"
HANDOFF_PATIENT_KEY = "handoff-patient"
PATIENT_BACKOFF = 5.0
HANDOFF_KEY = "handoff"
HANDOFF_CRASH_ONCE = "worker_app.handoff_crash_once"
PLAIN_ECHO = "worker_app.plain_echo"
#: Two slots per customer and 10/s (burst 1) over all customers: the rate holds a
#: backlog back, the slots make its runs wait in their customer's line.
PACED = "worker_app.paced"
PACED_KEY = "paced"
PACED_RATE = 10
PACED_LIMITS = [{"slots": 2, "key": "paced:{customer}"},
                {"rate": f"{PACED_RATE}/s", "burst": 1, "key": PACED_KEY}]
QUIET_SLEEP = "worker_app.quiet_sleep"
QUIET_KEY = "quiet"
CHAIN_STEP = "worker_app.chain_step"
CHAIN_KEY = "chain-steps"

#: Small countdowns when every slot is taken, so that the tests run fast.
FAST_RETRY: Mapping[str, float] = {"lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.3}

_RECORD_START = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
redis.call('INCR', 'runs:' .. ARGV[1])
redis.call('HSET', 'started', ARGV[1], string.format('%.0f', micros))
for i = 2, #ARGV do
  local running = redis.call('INCR', 'running:' .. ARGV[i])
  redis.call('RPUSH', 'peaks:' .. ARGV[i], running)
end
return micros
"""

_RECORD_END = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
for i = 2, #ARGV do
  redis.call('DECR', 'running:' .. ARGV[i])
end
redis.call('HSET', 'ended', ARGV[1], string.format('%.0f', micros))
return micros
"""


@dataclass(frozen=True)
class AppUrls:
    """Where the app's broker, result backend, lock store and record store are."""

    broker: str
    backend: str
    lock: str
    record: str

    @classmethod
    def on_server(cls, server_url: str) -> AppUrls:
        """Four databases of one Redis server: broker 0, backend 1, locks 2, records 3.

        ``server_url`` is a ``redis://host:port`` URL, with or without a database number.
        """
        base = server_url.rstrip("/")
        scheme, _, rest = base.partition("://")
        host_port = rest.split("/", 1)[0]
        root = f"{scheme}://{host_port}"
        return cls(broker=f"{root}/0", backend=f"{root}/1", lock=f"{root}/2",
                   record=f"{root}/3")

    @classmethod
    def from_environment(cls, environ: Optional[Mapping[str, str]] = None) -> AppUrls:
        """Read the URLs from the ``REDISLOCK_TEST_*_URL`` environment variables."""
        environ = os.environ if environ is None else environ
        return cls(broker=environ[BROKER_URL_ENV], backend=environ[BACKEND_URL_ENV],
                   lock=environ[LOCK_URL_ENV], record=environ[RECORD_URL_ENV])

    def environment(self) -> Dict[str, str]:
        """The environment variables that :meth:`from_environment` reads."""
        return {BROKER_URL_ENV: self.broker, BACKEND_URL_ENV: self.backend,
                LOCK_URL_ENV: self.lock, RECORD_URL_ENV: self.record}


class Recorder:
    """Writes the start and end of task bodies to the record store (see the module doc).

    One per process; redis-py notices a fork and reconnects in the child.
    """

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        self._start = self.client.register_script(_RECORD_START)
        self._end = self.client.register_script(_RECORD_END)

    def start(self, task_id: str, keys: Sequence[str]) -> int:
        """Record that the body of ``task_id`` started under each of ``keys``."""
        return int(self._start(args=[task_id, *keys]))

    def end(self, task_id: str, keys: Sequence[str]) -> int:
        """Record that the body of ``task_id`` ended under each of ``keys``."""
        return int(self._end(args=[task_id, *keys]))

    def run(self, task_id: str, keys: Sequence[str], seconds: float) -> None:
        """Record a body that works for ``seconds`` under ``keys``."""
        self.start(task_id, keys)
        try:
            time.sleep(seconds)  # the simulated work of the task body
        finally:
            self.end(task_id, keys)


_recorders: Dict[str, Recorder] = {}
_recorders_guard = threading.Lock()


def recorder(url: str) -> Recorder:
    """The :class:`Recorder` of ``url``, made once per process."""
    with _recorders_guard:
        if url not in _recorders:
            _recorders[url] = Recorder(url)
        return _recorders[url]


def count_signals(app: Celery, record_url: str,
                  state_of: Callable[[Any], bool] = lambda task: True,
                  revoked: bool = False) -> None:
    """Count in the record store, by task id, what Celery says of ``app``'s tasks: each
    ``task_prerun`` (hash ``prerun``), ``task_postrun`` (``postrun``) and, if ``revoked``,
    ``task_revoked`` (``revoked``); and the state of its result at prerun
    (``prerun-state``) for the tasks ``state_of`` selects.

    The handlers are connected for the whole process, which outlives ``app`` in a test
    process: they count runs of this app's tasks only (another app's embedded worker
    must not call a record store that is gone)."""

    def count(name: str, task_id: Optional[str]) -> None:
        if task_id:
            recorder(record_url).client.hincrby(name, task_id, 1)

    def ours(task: Any) -> bool:
        return getattr(task, "app", None) is app

    @task_prerun.connect(weak=False)
    def on_prerun(task_id: Optional[str] = None, task: Any = None, **_: Any) -> None:
        if not ours(task):
            return
        count("prerun", task_id)
        if task is not None and task_id and state_of(task):
            state = task.AsyncResult(task_id).state
            recorder(record_url).client.hset("prerun-state", task_id, state)

    @task_postrun.connect(weak=False)
    def on_postrun(task_id: Optional[str] = None, task: Any = None, **_: Any) -> None:
        if ours(task):
            count("postrun", task_id)

    if revoked:
        @task_revoked.connect(weak=False)
        def on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
            if ours(sender):
                count("revoked", getattr(request, "id", None))


def line_from_environment(app: Celery) -> Celery:
    """``app`` on the line :data:`LINE_ENV` names, if set (else the package's default)."""
    line = os.environ.get(LINE_ENV)
    if line:
        app.conf.redislock_line = line
    return app


def create_app(urls: AppUrls) -> Celery:
    """A Celery app on ``urls`` with the test tasks registered.

    The tasks are not shared (``shared=False``): a process that makes several apps, as
    the test process does, must not have the first app's tasks, which write to the first
    app's record store, registered in the later ones.
    """
    app = Celery("worker_app", broker=urls.broker, backend=urls.backend,
                 set_as_current=False)
    app.conf.update(
        redislock_url=urls.lock,
        redislock_limits={PACED: PACED_LIMITS},
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
    )
    line_from_environment(app)
    if os.environ.get(HAND_ON_ENV) == "0":
        app.conf.redislock_hand_on = False

    @app.task(base=LimitedTask, bind=True, shared=False, name=LIMITED_SLEEP, lock_slots=2,
              **FAST_RETRY)
    def limited_sleep(self: Any, seconds: float = 0.2) -> str:
        """At most two at once across the cluster."""
        recorder(urls.record).run(self.request.id, [LIMITED_KEY], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=SYNC_CUSTOMER, lock_slots=1,
              lock_key="customer:{customer_id}", **FAST_RETRY)
    def sync_customer(self: Any, customer_id: int, seconds: float = 0.2) -> int:
        """At most one at once per customer; customers run side by side."""
        keys = [f"customer:{customer_id}", CUSTOMERS_KEY]
        recorder(urls.record).run(self.request.id, keys, seconds)
        return customer_id

    @app.task(base=LimitedTask, bind=True, shared=False, name=SHORT_LEASE_SLEEP, lock_slots=1,
              lock_lease=1, **FAST_RETRY)
    def short_lease_sleep(self: Any, seconds: float) -> str:
        """One at a time, on a one-second lease that must be renewed while it runs."""
        recorder(urls.record).run(self.request.id, [SHORT_LEASE_KEY], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=HANDOFF_SLEEP, lock_slots=2)
    def handoff_sleep(self: Any, seconds: float = 0.2) -> str:
        """At most two at once, with the default waiting settings: freed slots are
        handed to the oldest waiter."""
        recorder(urls.record).run(self.request.id, [HANDOFF_KEY], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=HANDOFF_PATIENT, lock_slots=2,
              lock_key=HANDOFF_PATIENT_KEY, lock_retry_backoff=PATIENT_BACKOFF)
    def handoff_patient(self: Any, seconds: float = 0.2) -> str:
        """At most two at once; a run that is not handed a slot waits 2.5 s or more."""
        recorder(urls.record).run(self.request.id, [HANDOFF_PATIENT_KEY], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=HANDOFF_CRASH_ONCE,
              lock_slots=1, lock_key="crash-once", lock_retry_backoff=0.3,
              lock_retry_backoff_max=0.6, acks_late=True, reject_on_worker_lost=True)
    def handoff_crash_once(self: Any) -> str:
        """Its first run's process is SIGKILLed in the body; the broker redelivers it."""
        record = recorder(urls.record)
        record.start(self.request.id, ["crash-once"])
        if record.client.incr(f"crashes:{self.request.id}") == 1:
            os.kill(os.getpid(), 9)
        record.end(self.request.id, ["crash-once"])
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=QUIET_SLEEP, lock_slots=20,
              lock_key=QUIET_KEY, ignore_result=True)
    def quiet_sleep(self: Any, seconds: float = 0.05) -> None:
        """More slots than the cluster has processes, and no result stored: every run
        leaves its release to go with its process's next request to the lock store."""
        recorder(urls.record).run(self.request.id, [QUIET_KEY], seconds)

    @app.task(base=LimitedTask, bind=True, shared=False, name=PACED)
    def paced(self: Any, customer: int, seconds: float = 0.02) -> str:
        """At most two at once per customer, and 10 starts a second in all (limits in
        ``redislock_limits``); records when its limits admitted it (server ms) in
        ``admitted``."""
        record = recorder(urls.record)
        record.client.hset("admitted", self.request.id,
                           self.request.redislock_lease.acquired_at_ms)
        record.run(self.request.id, [f"{PACED_KEY}:{customer}"], seconds)
        return self.request.id

    @app.task(base=LimitedTask, bind=True, shared=False, name=CHAIN_STEP, lock_slots=2,
              lock_key=CHAIN_KEY, lock_retry_backoff=PATIENT_BACKOFF)
    def chain_step(self: Any, steps: Sequence[str], block: bool = False) -> Sequence[str]:
        """One step of a chain: records its run and adds its id to ``steps``. With
        ``block``, it also takes the key's other slot by hand (for 2 s, never released),
        so that the next step finds the semaphore full until this step's release. A step
        not handed a slot would wait for its countdown of 5 s or more."""
        record = recorder(urls.record)
        record.start(self.request.id, [CHAIN_KEY])
        if block:
            from celery_redislock.engine.admission import SlotLimit, admit
            admit(redis.Redis.from_url(urls.lock), [SlotLimit(CHAIN_KEY, 2, "redislock:")],
                  lease=2)
        record.end(self.request.id, [CHAIN_KEY])
        return [*steps, self.request.id]

    @app.task(shared=False, name=PLAIN_ECHO)
    def plain_echo(value: Any) -> Any:
        """No limit at all: shows that pool processes are free while limited runs wait."""
        return value

    return app


#: The app of the worker processes, which find the URLs in their environment. The test
#: process imports this module without those variables and calls :func:`create_app`.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment()) if BROKER_URL_ENV in os.environ else None
)
