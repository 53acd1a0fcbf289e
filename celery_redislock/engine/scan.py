"""Finding an app's limits in Redis: ``SCAN`` by key pattern, and the keys of one name.

Every Redis key of a limit name is ``<prefix>{<16 hex digest>}:<mark>:<readable name>``
(see :mod:`celery_redislock.engine.keys`); the mark says what it holds:

======  ==============================================================================
``s``   the semaphore: sorted set of holders (and ``~~<n>`` reservations, statistics)
``cs``  its control hash (operators): ``slots``, ``paused_until``
``p*``  its parked line's counts and references (see :mod:`.parked_view`)
``r``   the rate limiter of the same name
``cr``  the rate limiter's control hash (operators): ``paused_until``, ``rate`` and
        ``interval`` (µs) of a rate set at run time
======  ==============================================================================

    >>> companion_key("redislock:{85280b862f4ca735}:s:customer:42", "cs")
    'redislock:{85280b862f4ca735}:cs:customer:42'
    >>> for keys in batches(semaphore_keys(client, "redislock:")):  # doctest: +SKIP
    ...     ...   # up to 200 semaphore keys at a time

On a Redis Cluster client, redis-py's ``scan_iter`` visits every primary node.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from .keys import RATE_CONTROL, SEMAPHORE, SEMAPHORE_CONTROL, SEMAPHORE_MARK, companion_key

_KEY = re.compile(r"\{[0-9a-f]{16}\}:([a-z]+):(.*)\Z", re.S)


def _escape(prefix: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in prefix)


def semaphore_key_pattern(prefix: str) -> str:
    """The ``SCAN`` pattern of every semaphore key under ``prefix``."""
    return f"{_escape(prefix)}*{SEMAPHORE_MARK}*"


def split_key(key: str, prefix: str) -> Optional[Tuple[str, str]]:
    """``(mark, readable name)`` of a key of the package under ``prefix``, else None.

        >>> split_key("redislock:{85280b862f4ca735}:cr:customer:42", "redislock:")
        ('cr', 'customer:42')
        >>> split_key("other:thing", "redislock:") is None
        True
    """
    if not key.startswith(prefix):
        return None
    found = _KEY.match(key, len(prefix))
    return (found.group(1), found.group(2)) if found else None


def limit_semaphore_keys(client: Any, prefix: str,
                         marks: Iterable[str] = (SEMAPHORE, SEMAPHORE_CONTROL,
                                                 RATE_CONTROL)) -> List[str]:
    """The semaphore key of every name under ``prefix`` that has a key with one of
    ``marks`` (by default: a semaphore or a control hash), sorted. One ``SCAN`` of the
    prefix.

    A rate limiter with a control hash (paused) counts; its semaphore key may not exist.
    """
    found = set()
    wanted = set(marks)
    for key in client.scan_iter(match=f"{_escape(prefix)}{{*}}:*", count=1000):
        key = key.decode() if isinstance(key, bytes) else key
        split = split_key(key, prefix)
        if split is not None and split[0] in wanted:
            found.add(companion_key(key, SEMAPHORE))
    return sorted(found)


def semaphore_keys(client: Any, prefix: str) -> Iterator[str]:
    """Every semaphore key under ``prefix`` (as text), in no particular order."""
    for key in client.scan_iter(match=semaphore_key_pattern(prefix), count=1000):
        yield key.decode() if isinstance(key, bytes) else key


def batches(items: Iterable[Any], size: int = 200) -> Iterator[List[Any]]:
    """``items`` in lists of at most ``size``."""
    batch: List[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
