"""Operators' tools: what a limit looks like now, and the one API that changes it.

``state`` reads a limit's holders, parked line and controls in batches (read only);
``control`` is the one API that changes them (slot overrides, pauses, resume, freeing a
holder), used by the CLI and by Python callers alike; ``cli`` is ``celery redislock``;
``watch`` its live view.

May import: every layer below (``errors``, ``engine``, ``config``, ``integration``: to
know which tasks an app limits, and how).
"""
