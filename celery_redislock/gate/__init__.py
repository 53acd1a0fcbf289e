"""The worker's main process: each limited request asked for before the pool sees it, and
the slots of runs that could not give them back.

=================  ===================================================================
``gate``           the strategy of limited tasks: a request admitted, held for a pool
                   process, parked or ended before the pool; the run's end there
``main_process``   the interpreter of :func:`~..run.decide.decide` in the main process
                   (hand to the pool, hold, park, or end the copy: ``Ignore``)
``room``           the requests held for a free pool process: one queue per worker, its
                   timer, the look-ahead
``hand_on``        a slot handed to the next run of its key waiting in this worker
``kept_leases``    the slots of ended runs kept a moment for the next runs of their key
``standby``        the line's next run held here with no slot, handed an ended run's slot
``hub_store``      the worker's connection to the lock store on its event loop
``recovery``       a lost run's slots freed; ``LimitedRequest``; a worker's registration
``startup``        what a worker checks about its lock store as it starts
``task_context``   a request's task context and revocation, read cheaply for the gate
=================  ===================================================================

The main process never blocks on the network (``redislock_gate = "async"``); the blocking
gate is the exception the worker names at start.

May import: ``celery``, ``kombu``, ``billiard``, ``redis``, ``celery_redislock.errors``,
``engine``, ``config``, ``parking``, ``run``, ``line`` and ``pool``.
"""
