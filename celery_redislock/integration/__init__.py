"""The Celery integration: limited task classes, the run of a limited task, waiting.

Where a Celery task meets the engine: :class:`~.task.LimitedTask` and
:class:`~.task.SingletonTask`, :func:`~.install.install` for plain tasks named by
``redislock_limits``, the run itself (``execution``: admit, run, give back), what a
refused run does (``waiting``, ``handoff``), the worker's recovery of a lost run's slots
(``recovery``) and the package's signals (``signals``).

May import: ``celery``, ``kombu``, ``billiard``, ``celery_redislock.errors``,
``celery_redislock.engine``, ``celery_redislock.config`` and
``celery_redislock.parking``.
"""
