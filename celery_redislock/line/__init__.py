"""The waiting line on Celery's side: a refused run parked, moved, handed on or sent back.

Beside :mod:`celery_redislock.parking` (the broker's queues, no Celery) and
:mod:`celery_redislock.engine.parking` (the lock store's references), this layer joins
the two for a Celery app:

===================  =================================================================
``broker_line``      the parking line's wiring for an admission: a run's park ask and
                     its reference
``moves``            a parked copy published, and the moves owed, on this process's
                     mover
``poll``             each worker's poll for slots freed without a release
``handoff``          the moves the store's scripts hand over as slots free, published
``waiting``          a refused run sent back (its countdown, ``max_wait``) or said parked
``parked_deadline``  a parked run past its ``lock_max_wait``
``priority``         a message's priority, in its broker's own order
===================  =================================================================

Importing the layer connects the poll's receivers (it starts with the worker and
stops with it, as the limited tasks that import the layer need).

May import: ``celery``, ``kombu``, ``celery_redislock.errors``, ``engine``, ``config``,
``parking`` and ``run``.
"""

from . import poll  # noqa: F401  (its receivers start and stop the worker's poll)
