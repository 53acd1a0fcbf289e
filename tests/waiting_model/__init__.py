"""A pure model of design (c), "the broker is the line": broker, lock store and workers.

No Redis and no Celery: plain Python state that :mod:`tests.test_waiting_model` drives
through random interleavings. Each step a worker takes is one small function of
:mod:`.worker`, named after what the real implementation does at that point, so that
every step maps to one place in it:

* :mod:`.broker` -- a main queue per task, a parking queue per limit key, deliveries
  left unacknowledged until acknowledged, and redelivery of a dead worker's deliveries;
* :mod:`.store` -- the lock store's scripts as functions over its state: holders on
  leases, the waiters' references, reservations, the incarnation and its grace;
* :mod:`.worker` -- the protocol: ask, decide (today's :func:`decide`), run, park (a
  move: publish, then acknowledge), release and hand over, move one out of parking,
  end a stale copy, the due poll.

``docs/architecture.md`` ("What the model test found") says which parts of the protocol
as first written the model showed wrong, and how :class:`.worker.Protocol` fixes them.
"""
