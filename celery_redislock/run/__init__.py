"""One limited run's state, in either process: what every layer above reads and decides.

=================  ===================================================================
``waiting_run``    :class:`WaitingRun`, the wait a message carries (``redislock_wait``)
``decide``         the action for the store's answer: pure, no clock, no Redis, no Celery
``limited``        which tasks are limited, their leases, this process's worker start
``signals``        the signals a run sends (public as ``integration.signals``)
=================  ===================================================================

Nothing here publishes, acknowledges, sleeps or ends a run: the interpreters above
(``pool.pool_process``, ``gate.main_process``) carry :func:`~.decide.decide`'s action out.

May import: the standard library, ``celery`` (its signal type), ``celery_redislock.errors``,
``celery_redislock.engine``, ``celery_redislock.config`` and ``celery_redislock.parking``.
"""
