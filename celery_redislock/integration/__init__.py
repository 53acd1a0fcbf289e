"""The Celery integration: the task classes and the settings users meet.

=================  ===================================================================
``task``           :class:`~.task.LimitedTask` and :class:`~.task.SingletonTask`
``install``        :func:`~.install.install`: ``redislock_limits`` applied to plain tasks
``unique``         unique sends (``lock_unique``), and a run with task-wide options
``period``         at most one run per key per period (``lock_period``)
``signals``        the signals users connect to (defined in :mod:`..run.signals`)
=================  ===================================================================

The life of a run is in the layers below: its state and decision (``run``), the waiting
line (``line``), the process that runs it (``pool``) and the worker's main process
(``gate``). Only the two interpreters end a waiting run with ``Ignore`` (``period`` ends a
run its ``lock_period`` drops).

May import: ``celery``, ``kombu``, ``billiard``, ``celery_redislock.errors``, ``engine``,
``config``, ``parking``, ``run``, ``line``, ``pool`` and ``gate``.
"""
