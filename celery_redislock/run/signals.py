"""Celery-style signals about slots, sent in the process that runs the task.

Connect to them like Celery's own signals; ``sender`` is the task::

    from celery_redislock.integration.signals import lock_contended

    @lock_contended.connect
    def count_waits(sender=None, key=None, countdown=None, **kwargs):
        statsd.incr(f"redislock.contended.{sender.name}")

==================  ===========================================================
``lock_acquired``   a run was admitted: ``task_id``, ``lease``, ``waited`` (s,
                    since it was first refused, on the server's clock; 0 if never)
``lock_contended``  a run was refused by a concurrency limit, or could not reach
                    the lock store, and goes back to the queue: ``task_id``,
                    ``key``, ``countdown`` (s; 0 for a run parked on the parking
                    line), ``reason``
``rate_limited``    a run was refused by a rate limit: ``task_id``, ``key``,
                    ``countdown`` (s), ``promise`` (µs, server clock; for a run
                    parked on the parking line: countdown 0, promise None)
``lock_released``   a run gave its slots back: ``task_id``, ``lease``, ``held`` (s)
``lease_lost``      a renewal found a running task's lease gone: ``task_id``,
                    ``lease``
``lock_store_error`` the lock store refused or failed a call: ``task_id`` (None if
                    no run), ``key`` (the Redis key or limit concerned, or
                    None), ``kind`` (``full``, ``readonly``, ``loading``,
                    ``auth``, ``permission``, ``unknown_command``, ``script``),
                    ``message`` (the server's). ``sender`` is the task, or the
                    app when no task is concerned
==================  ===========================================================

Receivers run inside the task's process; Celery logs and swallows their exceptions.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

lock_acquired = Signal(name="lock_acquired", providing_args={"task_id", "lease", "waited"})
lock_contended = Signal(
    name="lock_contended", providing_args={"task_id", "key", "countdown", "reason"}
)
rate_limited = Signal(
    name="rate_limited", providing_args={"task_id", "key", "countdown", "promise"}
)
lock_released = Signal(name="lock_released", providing_args={"task_id", "lease", "held"})
lease_lost = Signal(name="lease_lost", providing_args={"task_id", "lease"})
lock_store_error = Signal(
    name="lock_store_error", providing_args={"task_id", "key", "kind", "message"}
)
