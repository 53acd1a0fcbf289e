"""The waiting line on Celery's side: a refused run parked, moved, handed on or sent back.

Beside :mod:`celery_redislock.parking` (the broker's queues, no Celery) and
:mod:`celery_redislock.engine.parking` (the lock store's references), this layer joins
the two for a Celery app:

===================  =================================================================
``broker_line``      the parking line's wiring: a run's park ask and its reference, the
                     per-process mover, the moves owed, the poll (a worker bootstep)
``handoff``          the moves the store's scripts hand over as slots free, published
``waiting``          a refused run sent back (its countdown, ``max_wait``) or said parked
``parked_deadline``  a parked run past its ``lock_max_wait``
``priority``         a message's priority, in its broker's own order
===================  =================================================================

May import: ``celery``, ``kombu``, ``celery_redislock.errors``, ``engine``, ``config``,
``parking`` and ``run``.
"""
