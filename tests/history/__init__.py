"""A Jepsen-style history check of celery-redislock under faults.

Real ``celery worker`` processes run tasks of several kinds against a lock store that a
seeded schedule of faults kills, restarts, pauses and stops; every body, signal, fault and
final state is written as an event to a recorder Redis that is never faulted, on that
server's clock. The checker then reads the history against the model: never more bodies
at once than a key's slots, never more admissions in one period than a rate allows, every
task sent reaches a final state, every body that ran more than once is explained.

One module per job:

``events``     the history's events: how they are written (one Lua script, the
               recorder's clock) and read back
``workload``   the task kinds (their limits) and a seed's plan of tasks to send
``app``        the Celery app the workers run: one task per kind and ack mode
``servers``    the broker, the lock store (kept with AOF, or not kept) and the recorder
``workers``    the three workers: start, SIGKILL whole and restart, SIGSTOP and SIGCONT
``faults``     a seed's fault schedule, and the injector that carries it out
``checker``    the model check over a history (pure: unit-tested on made-up histories)
``leases``     the renewals of the bodies' leases, and a holder's lease that ran out
               unrenewed: the known cause of a key taken past its slots
``table``      one table per run
``run``        one run: start everything, send, inject, settle, check
``cli``        ``python -m tests.history --seed 3 --tasks 300 --faults-for 90
               --persistence aof``

Run it from the repository's root::

    .venv/bin/python -m tests.history --seed 3 --tasks 300 --faults-for 90 --persistence aof

Inside the package every import of a sibling is relative, and the modules of ``tests/``
(``redis_process``, ``worker_cluster``) are imported by their own names: ``tests/`` is on
the path for pytest (``pythonpath``), for the workers (``PYTHONPATH``) and, through
``__main__``, for ``python -m tests.history``.
"""
