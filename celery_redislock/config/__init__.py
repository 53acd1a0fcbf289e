"""Configuration: task options, app settings and limit definitions, all checked.

Turns what the user wrote (``lock_*`` task options, ``redislock_*`` app settings, the
``redislock_limits`` setting) into checked values: :class:`~.limit.TaskLimits`, the
:class:`~.settings.Settings` and a Redis client. Nothing here runs a task or changes
Redis: building a client is as far as it goes.

May import: ``celery_redislock.errors`` and ``celery_redislock.engine`` (the limit kinds
it builds). It reads a Celery app's ``conf`` but does not import Celery's worker machinery.

====================  =================================================================
``limit``             a task's limits, checked once
``limits_setting``    the ``redislock_limits`` setting, and ``check_limits``
``settings``          the ``redislock_*`` app settings, and the Redis client they describe
``sentinel``          ``sentinel://`` URLs
``retry``             how long a refused run waits before it asks again
``cost``              a run's weight (``lock_cost``): a number, or a callable, checked
====================  =================================================================
"""
