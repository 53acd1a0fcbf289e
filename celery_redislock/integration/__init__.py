"""The Celery integration: limited task classes, the run of a limited task, waiting.

Where a Celery task meets the engine: :class:`~.task.LimitedTask` and
:class:`~.task.SingletonTask`, :func:`~.install.install` for plain tasks named by
``redislock_limits``, and the life of one run:

=================  ===================================================================
``gate``           the worker's main process: each request asked for before the pool
``attempt``        one run's admission: its limiters, its description, its one call
``decide``         the action for the store's answer: pure, no clock, no Redis, no Celery
``main_process``   the main process's interpreter of that action (hand to the pool,
                   hold, park, or end the copy: ``Ignore``, then acknowledged)
``pool_process``   the pool process's interpreter (run holding the lease, sleep for a
                   start, park from here, or end the copy: ``Ignore``)
``waiting``        a refused run sent back (its countdown, ``max_wait``), or said parked
``earlier_run``    a redelivered run that meets the earlier run of its task id
``broker_line``    the parking line's wiring: the store's references, the broker's queues
``give_back``      the end of a run: its slots given back
=================  ===================================================================

and the rest: ``waiting_run`` (the wait a message carries), ``pool_park``,
``parked_deadline``, ``handoff``, ``hand_on`` (a slot handed to the next run waiting
in the same worker), ``hub_store`` (the worker's non-blocking connection),
``store_errors``, ``recovery`` (a lost run's slots), ``startup``, ``unique``,
``period``, ``task_context`` and ``signals``. Only the two interpreters end a waiting
run with ``Ignore`` (``period`` ends a run its ``lock_period`` drops).

May import: ``celery``, ``kombu``, ``billiard``, ``celery_redislock.errors``,
``celery_redislock.engine``, ``celery_redislock.config`` and
``celery_redislock.parking``.
"""
