"""celery-redislock: cluster-wide concurrency limits and singletons for Celery tasks.

Example::

    from celery import Celery
    from celery_redislock import LimitedTask, SingletonTask

    app = Celery("proj", broker="redis://localhost:6379/0")

    @app.task(base=LimitedTask, lock_slots=2)
    def crawl(url): ...

    @app.task(base=SingletonTask)
    def rebuild_index(): ...
"""

from . import recovery  # noqa: F401 - connects the worker's crash-recovery receivers
from .admission import Busy, Lease, RateLimited
from .config import check_limits
from .errors import (
    LockConfigurationError,
    LockKeyError,
    LockStoreUnavailable,
    LockTimeout,
    LockWaitTimeout,
    RedisLockError,
)
from .install import install
from .rate import Rate
from .rate_limiter import RateLimiter
from .semaphore import Semaphore
from .task import LimitedTask, SingletonTask

__all__ = [
    "Busy",
    "Lease",
    "LimitedTask",
    "LockConfigurationError",
    "LockKeyError",
    "LockStoreUnavailable",
    "LockTimeout",
    "LockWaitTimeout",
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
