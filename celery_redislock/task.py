"""``LimitedTask`` and ``SingletonTask``: Celery task classes whose runs take a slot first."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional, Union

from celery import Task
from redis.exceptions import RedisError

from .errors import LockStoreUnavailable, LockWaitTimeout
from .keeper import lease_keeper
from .keys import KeySource
from .limit import OPTION_DEFAULTS, ConcurrencyLimit
from .semaphore import Busy, Lease, Semaphore
from .settings import Settings, read_settings, redis_client
from .waiting import requeue_for_slot

logger = logging.getLogger(__name__)


class LimitedTask(Task):
    """A task of which at most ``lock_slots`` runs happen at once, across every worker.

    Example::

        @app.task(base=LimitedTask, lock_slots=2)
        def crawl(url): ...

        @app.task(base=LimitedTask, lock_slots=1, lock_key="customer:{customer_id}")
        def sync_customer(customer_id, full=False): ...

    The slot is taken in the worker just before the body runs and given back when the body
    ends, however it ends. When every slot is taken the run goes back to the queue with a
    countdown (no worker process waits, and ``max_retries`` is not used up). Options:

    ``lock_slots``             runs allowed at once per key (default 1)
    ``lock_key``               the key: a template over the task's argument names such as
                               ``"customer:{customer_id}"``, or a callable taking the task's
                               arguments; default the task's name. Tasks naming the same key
                               share its slots.
    ``lock_lease``             seconds a slot stays taken without renewal (default 30);
                               a running task renews it every third of that
    ``lock_retry_backoff``     first countdown when no slot is free, seconds (default 1)
    ``lock_retry_backoff_max`` longest countdown, seconds (default 30)
    ``lock_retry_jitter``      spread countdowns randomly (default True)
    ``lock_max_wait``          give up after waiting this many seconds in all, failing the
                               task with :class:`LockWaitTimeout` (default None: never)

    Inside the body, ``self.request.redislock_lease`` is the :class:`Lease` held.
    """

    lock_slots: int = OPTION_DEFAULTS["lock_slots"]
    lock_key: KeySource = OPTION_DEFAULTS["lock_key"]
    lock_lease: float = OPTION_DEFAULTS["lock_lease"]
    lock_retry_backoff: float = OPTION_DEFAULTS["lock_retry_backoff"]
    lock_retry_backoff_max: float = OPTION_DEFAULTS["lock_retry_backoff_max"]
    lock_retry_jitter: bool = OPTION_DEFAULTS["lock_retry_jitter"]
    lock_max_wait: Optional[float] = OPTION_DEFAULTS["lock_max_wait"]

    _redislock_limit: Optional[ConcurrencyLimit] = None
    _redislock_settings: Optional[Settings] = None
    _redislock_fixed: Optional[Semaphore] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self).run is not Task.run:
            self._redislock_limit = self._compile_limit()

    def _compile_limit(self) -> ConcurrencyLimit:
        options = {option: getattr(self, option) for option in OPTION_DEFAULTS}
        name = self.name or f"{type(self).__module__}.{type(self).__qualname__}"
        return ConcurrencyLimit.from_options(name, self.run, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            # A plain function call, not an execution by Celery: no limit, like rate_limit.
            return super().__call__(*args, **kwargs)
        settings = self._settings()
        if not settings.enabled:
            return self.run(*args, **kwargs)
        limit = self._redislock_limit or self._compile_limit()
        semaphore = self._semaphore(limit, settings, args, kwargs)
        lease = self._take_slot(limit, semaphore, request, args, kwargs)
        request.redislock_lease = lease
        try:
            # The tracer has pushed this run's request already: call the body directly, as
            # Celery's worker does, so that apply() and eager runs see the right request.
            return self.run(*args, **kwargs)
        finally:
            self._give_back(lease)

    def _settings(self) -> Settings:
        if self._redislock_settings is None:
            self._redislock_settings = read_settings(self._get_app())
        return self._redislock_settings

    def _semaphore(self, limit: ConcurrencyLimit, settings: Settings, args: Any,
                   kwargs: Any) -> Semaphore:
        if limit.key.is_constant:
            if self._redislock_fixed is None:
                self._redislock_fixed = limit.semaphore(
                    redis_client(self._get_app(), settings), args, kwargs,
                    prefix=settings.prefix,
                )
            return self._redislock_fixed
        return limit.semaphore(
            redis_client(self._get_app(), settings), args, kwargs, prefix=settings.prefix
        )

    def _take_slot(self, limit: ConcurrencyLimit, semaphore: Semaphore, request: Any,
                   args: Any, kwargs: Any) -> Lease:
        description = json.dumps({
            "task": self.name, "id": request.id, "worker": request.hostname,
            "pid": os.getpid(),
        })
        outcome: Union[Lease, Busy, None]
        try:
            outcome = semaphore.attempt(description)
        except RedisError as exc:
            if request.is_eager:
                raise LockStoreUnavailable(
                    f"Task {self.name!r}: the lock store is unreachable: {exc}"
                ) from exc
            # Fail closed: never run unlimited, never drop the task; ask again later.
            logger.warning("celery-redislock: task %s[%s]: lock store unreachable (%r)",
                           self.name, request.id, exc)
            outcome = None
        if isinstance(outcome, Lease):
            lease_keeper().keep(outcome)
            return outcome
        if request.is_eager:
            return self._wait_in_place(limit, semaphore, description)
        reason = (f"found all {semaphore.slots} slot(s) of {semaphore.name!r} taken"
                  if outcome is not None else "could not reach the lock store")
        requeue_for_slot(self, request, args, kwargs, limit.retry, outcome, reason)

    def _wait_in_place(self, limit: ConcurrencyLimit, semaphore: Semaphore,
                       description: str) -> Lease:
        """Eager runs (``apply()``, ``task_always_eager``) have no queue to go back to:
        they wait here for a slot, at most ``lock_max_wait`` seconds."""
        lease = semaphore.acquire(blocking=True, timeout=limit.retry.max_wait,
                                  keep_alive=True, description=description)
        if lease is None:
            raise LockWaitTimeout(
                f"Task {self.name!r}: no slot of {semaphore.name!r} came free within "
                f"lock_max_wait={limit.retry.max_wait} s"
            )
        return lease

    def _give_back(self, lease: Lease) -> None:
        lease_keeper().forget(lease)
        try:
            lease.release()
        except RedisError as exc:
            logger.warning(
                "celery-redislock: task %s could not release its slot of %r (%r); the slot "
                "comes back when its lease ends, within %.0f s",
                self.name, lease.name, exc, lease.lease_seconds,
            )


class SingletonTask(LimitedTask):
    """A task of which at most one run happens at a time across the cluster.

    Example::

        @app.task(base=SingletonTask)
        def rebuild_index(): ...

        @app.task(base=SingletonTask, lock_key="report:{account_id}")
        def build_report(account_id): ...   # one at a time per account

    The same as ``LimitedTask`` with ``lock_slots=1``, which it does not let you change.
    """

    lock_slots: int = 1

    def _compile_limit(self) -> ConcurrencyLimit:
        if self.lock_slots != 1:
            from .errors import LockConfigurationError

            raise LockConfigurationError(
                f"Task {self.name!r}: a SingletonTask has exactly one slot; "
                f"use LimitedTask for lock_slots={self.lock_slots!r}"
            )
        return super()._compile_limit()
