"""Finding every semaphore of an app in Redis: ``SCAN`` by key pattern, in batches.

    for keys in semaphore_key_batches(client, "redislock:"):
        ...   # up to 200 semaphore keys at a time

On a Redis Cluster client, redis-py's ``scan_iter`` visits every primary node.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List

#: What every semaphore key holds after its hash tag (see :func:`keys.semaphore_key`).
SEMAPHORE_MARK = "}:s:"


def semaphore_key_pattern(prefix: str) -> str:
    """The ``SCAN`` pattern of every semaphore key under ``prefix``."""
    escaped = "".join(f"\\{char}" if char in "*?[]\\" else char for char in prefix)
    return f"{escaped}*{SEMAPHORE_MARK}*"


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
