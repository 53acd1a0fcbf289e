"""A task's concurrency limit, checked once when the task is defined."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .backoff import RetryPolicy
from .errors import LockConfigurationError
from .keys import KeyTemplate
from .semaphore import DEFAULT_LEASE, Semaphore, check_lease, check_slots

#: Task options read by :meth:`ConcurrencyLimit.from_options`, with their defaults.
OPTION_DEFAULTS: Mapping[str, Any] = {
    "lock_slots": 1,
    "lock_key": None,
    "lock_lease": DEFAULT_LEASE,
    "lock_retry_backoff": 1.0,
    "lock_retry_backoff_max": 30.0,
    "lock_retry_jitter": True,
    "lock_max_wait": None,
}


@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``slots`` runs at once per semaphore name, the name built by ``key``.

    Example::

        limit = ConcurrencyLimit.from_options(
            "proj.tasks.sync_customer", sync_customer,
            lock_slots=1, lock_key="customer:{customer_id}",
        )
        limit.semaphore(client, (42,), {}, prefix="redislock:")   # Semaphore('customer:42', ...)
    """

    owner: str
    slots: int
    key: KeyTemplate
    lease: float
    retry: RetryPolicy

    @classmethod
    def from_options(
        cls, task_name: str, func: Callable[..., Any], **options: Any
    ) -> ConcurrencyLimit:
        """Check the ``lock_*`` options of a task and compile them.

        Raises :class:`LockConfigurationError` naming the task and the faulty option.
        """
        owner = f"Task {task_name!r}"
        unknown = set(options) - set(OPTION_DEFAULTS)
        if unknown:
            raise LockConfigurationError(f"{owner}: unknown option(s) {sorted(unknown)}")
        values = {**OPTION_DEFAULTS, **options}
        return cls(
            owner=owner,
            slots=check_slots(values["lock_slots"], owner, "lock_slots"),
            key=KeyTemplate(values["lock_key"], func, owner=owner, default=task_name),
            lease=check_lease(values["lock_lease"], owner, "lock_lease"),
            retry=RetryPolicy(
                backoff=_seconds(values["lock_retry_backoff"], owner, "lock_retry_backoff"),
                backoff_max=_seconds(
                    values["lock_retry_backoff_max"], owner, "lock_retry_backoff_max"
                ),
                jitter=_flag(values["lock_retry_jitter"], owner, "lock_retry_jitter"),
                max_wait=None if values["lock_max_wait"] is None
                else _seconds(values["lock_max_wait"], owner, "lock_max_wait"),
            ),
        )

    def semaphore(
        self, client: Any, args: Sequence[Any], kwargs: Mapping[str, Any], *, prefix: str
    ) -> Semaphore:
        """The semaphore that one call with these arguments must take a slot of."""
        return Semaphore(
            client, self.key.render(args, kwargs), slots=self.slots, lease=self.lease,
            prefix=prefix,
        )


def _seconds(value: Any, owner: str, option: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise LockConfigurationError(
            f"{owner}: {option} must be a number of seconds (0 or more), not {value!r}"
        )
    return float(value)


def _flag(value: Any, owner: str, option: str) -> bool:
    if not isinstance(value, bool):
        raise LockConfigurationError(f"{owner}: {option} must be True or False, not {value!r}")
    return value
