"""celery-redislock: cluster-wide concurrency limits and singletons for Celery tasks.

Example::

    from celery import Celery
    from celery_redislock import LimitedTask, SingletonTask

    app = Celery("proj", broker="redis://localhost:6379/0")

    @app.task(base=LimitedTask, lock_slots=2)
    def crawl(url): ...

    @app.task(base=SingletonTask)
    def rebuild_index(): ...

The package is built in layers, each a subpackage that imports only from the layers
below it (``tests/test_layers.py`` checks this):

=================  ===================================================================
``errors``         the exceptions every layer raises
``engine``         semaphores, rate limits and waiting lines in Redis; no Celery
``config``         options, settings and limit definitions, checked; runs nothing
``parking``        the broker's side of the parking line: parking queues, moves; no Celery
``run``            one limited run's state: its wait, the pure decision, its signals
``line``           the waiting line on Celery's side: park, move, hand off, send back
``pool``           a run in the process that runs it, and its admission
``gate``           the worker's main process: admission before the pool, recovery
``integration``    Celery's entry points: task classes, ``install``, unique sends
``admin``          operators' tools: state reads, the control API, the CLI
``metrics``        metrics fed by the signals, and the Prometheus exporter
``testing``        throw-away Redis servers and the pytest plugin
=================  ===================================================================

The names below are the public API. Those that need Celery are imported on first use, so
that ``import celery_redislock.engine`` does not import Celery.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any, List

from .engine.admission import Busy, Lease, Paused, RateLimited
from .engine.rate import Rate
from .engine.rate_limiter import RateLimiter
from .engine.semaphore import Semaphore
from .errors import (
    AlreadyQueued,
    LockConfigurationError,
    LockCostError,
    LockKeyError,
    LockStoreUnavailable,
    LockTimeout,
    LockWaitTimeout,
    RedisLockError,
)

if TYPE_CHECKING:
    from .config.limits_setting import check_limits
    from .integration.install import install
    from .integration.task import LimitedTask, SingletonTask

#: Public names that need Celery, and the module each is imported from on first use.
_LAZY = {
    "LimitedTask": "celery_redislock.integration.task",
    "SingletonTask": "celery_redislock.integration.task",
    "install": "celery_redislock.integration.install",
    "check_limits": "celery_redislock.config.limits_setting",
}

__all__ = [
    "AlreadyQueued",
    "Busy",
    "Lease",
    "LimitedTask",
    "LockConfigurationError",
    "LockCostError",
    "LockKeyError",
    "LockStoreUnavailable",
    "LockTimeout",
    "LockWaitTimeout",
    "Paused",
    "Rate",
    "RateLimited",
    "RateLimiter",
    "RedisLockError",
    "Semaphore",
    "SingletonTask",
    "check_limits",
    "install",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_redislock' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY))
