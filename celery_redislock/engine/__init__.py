"""The engine: leased semaphores, rate limits and fair waiting lines in Redis.

Everything here talks to Redis and to nothing else: it never imports ``celery`` or
``kombu`` (a test imports it in a fresh interpreter and checks), so it can be used, and
tested, without Celery. Every Redis interaction is one Lua script (``lua/``) or one
command, timed by the Redis server's clock.

May import: the standard library, redis-py's public API, ``celery_redislock.errors``.

=================  ===================================================================
``admission``      one round trip that admits a run past every limit on it, or says why not
``semaphore``      :class:`Semaphore`, a counting semaphore of leases, for use without Celery
``rate_limiter``   :class:`RateLimiter`, a GCRA rate limit on the server's clock
``rate``           rates such as ``"100/m"``
``keeper``         the background thread that renews held leases
``channel``        one connection per thread for the commands on every run's path
``hub_store``      one connection driven by an event loop (kombu's ``Hub``), never blocking it
``standby``        a parked line's next run held with no slot, handed a holder's slot
``late``           a moved copy still queued keeps the slot reserved for it (bounded)
``scripts``        the Lua scripts, loaded from ``lua/``, and hash-slot grouping
``holder``         a holder's entry in a semaphore
``keys``           the Redis keys of limit names
``key_template``   limit names from a task's arguments: templates, callables, hashed fields
``bounds``         the ranges a definition's numbers must fall in
``scan``           finding the limits in Redis by key pattern
=================  ===================================================================

Example::

    >>> from celery_redislock.engine.rate import Rate
    >>> Rate.parse("10/s").interval
    0.1
"""
