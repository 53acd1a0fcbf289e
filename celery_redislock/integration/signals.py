"""The package's signals, where users connect to them (defined in :mod:`..run.signals`,
sent in the process that runs the task)::

    from celery_redislock.integration.signals import lock_contended

    @lock_contended.connect
    def count_waits(sender=None, key=None, countdown=None, **kwargs):
        statsd.incr(f"redislock.contended.{sender.name}")
"""

from ..run.signals import (
    lease_lost,
    lock_acquired,
    lock_contended,
    lock_released,
    lock_store_error,
    rate_limited,
)

__all__ = ["lease_lost", "lock_acquired", "lock_contended", "lock_released",
           "lock_store_error", "rate_limited"]
