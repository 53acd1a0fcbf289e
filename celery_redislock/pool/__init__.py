"""A run in the process that runs it (a pool process, a worker without an event loop, an
eager call), and the admission steps the worker's main process shares with it.

=================  ===================================================================
``attempt``        one run's admission: its limiters, its description, its one call
``pool_process``   the interpreter of :func:`~..run.decide.decide` where the task runs:
                   run holding the lease, sleep for a start, park from here, or end the
                   copy (``Ignore``)
``pool_park``      parking a run from the process that runs it
``earlier_run``    a redelivered run that meets the earlier run of its task id
``give_back``      the end of a run: its slots given back
``store_errors``   what a failed call to the lock store means for a run
=================  ===================================================================

May import: ``celery``, ``kombu``, ``celery_redislock.errors``, ``engine``, ``config``,
``parking``, ``run`` and ``line``.
"""
