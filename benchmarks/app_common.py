"""What the apps of ``bench_peers`` and ``bench_admission`` share.

Every URL comes from the environment:

``REDISLOCK_BENCH_BROKER_URL``    broker
``REDISLOCK_BENCH_BACKEND_URL``   result backend (the sender, which reads results itself
                                  with one ``MGET``, uses ``disabled``)
``REDISLOCK_BENCH_LOCK_URL``      the lock store of every kind: this package's
                                  ``redislock_url``, celery-once's and celery-singleton's
``REDISLOCK_BENCH_COUNTER_URL``   where finished runs are counted (not the lock store, so
                                  that its command counts are the locks' alone)

Each app defines every kind twice, ``<prefix>.<kind>.ignored`` (no result stored) and
``<prefix>.<kind>.stored``, each taking one argument unique per run (so that the peers,
which lock on the task's arguments, never find a duplicate), and counts each finished
run with one ``INCR`` of :func:`counter_key` from its ``task_postrun`` handler, which
fires after every kind's release call:

    app = make_app("redislock_bench_peers", "redislock-bench-peers")
    define_tasks(app, {PLAIN: (None, {}), **peer_kinds()}, task_name, noop)
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

import redis
from celery import Celery, Task

try:
    from celery_once import QueueOnce
except ImportError:  # the bench extra is not installed: that kind is left out
    QueueOnce = None
try:
    from celery_singleton import Singleton
except ImportError:
    Singleton = None

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
BACKEND_ENV = "REDISLOCK_BENCH_BACKEND_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
COUNTER_ENV = "REDISLOCK_BENCH_COUNTER_URL"

#: Far more slots than the worker has processes: a kind with these is never contended.
SLOTS = 1000
PLAIN = "plain"
MODES = ("ignored", "stored")

#: Each kind's base class (``None``: a plain task) and task options.
KindOptions = Dict[str, Tuple[Optional[type], Dict[str, Any]]]


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set")
    return value


def make_app(main: str, queue: str, **conf: Any) -> Celery:
    """The benchmark's Celery app on the environment's URLs, every peer on the lock store."""
    lock_url = required_env(LOCK_ENV)
    app = Celery(main, broker=required_env(BROKER_ENV), backend=required_env(BACKEND_ENV))
    app.conf.update(
        redislock_url=lock_url,
        ONCE={"backend": "celery_once.backends.Redis",
              "settings": {"url": lock_url, "default_timeout": 3600}},
        singleton_backend_url=lock_url,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **conf,
    )
    return app


def peer_kinds() -> KindOptions:
    """celery-once's ``QueueOnce`` (locks in ``apply_async``, on the sender; unlocks in
    ``after_return``) and celery-singleton's ``Singleton`` (locks in ``apply_async``;
    unlocks in ``on_success``), each left out when its library is missing."""
    kinds: KindOptions = {}
    if QueueOnce is not None:
        kinds["once"] = (QueueOnce, {"once": {"graceful": True}})
    if Singleton is not None:
        kinds["singleton"] = (Singleton, {})
    return kinds


def counter_key(name: str) -> str:
    """The key that counts finished runs of task ``name``."""
    return f"bench:done:{name}"


def define_tasks(app: Celery, kinds: KindOptions, task_name: Callable[[str, str], str],
                 body: Callable[..., Any]) -> None:
    """Register ``body`` as every kind's task, once per mode in :data:`MODES`."""
    for kind, (base, options) in kinds.items():
        for mode in MODES:
            extra = dict(options)
            if base is not None:
                extra["base"] = base
            app.task(name=task_name(kind, mode), ignore_result=mode == "ignored",
                     **extra)(body)


_counter_client: Optional[redis.Redis] = None


def count_finished(sender: Optional[Task], prefix: str) -> None:
    """Count one finished run of ``sender`` if its name starts with ``prefix``; the
    client is made on first use, in the pool process (after any fork)."""
    global _counter_client
    if sender is not None and sender.name.startswith(prefix):
        if _counter_client is None:
            _counter_client = redis.Redis.from_url(required_env(COUNTER_ENV))
        _counter_client.incr(counter_key(sender.name))
