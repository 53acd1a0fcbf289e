"""Moved copies that are late, not lost: their reservations kept while they wait.

A slot handed to a parked line is reserved for the moved copy for
:data:`~.parking.RESERVE_MS` (10 s). When the workers are busy the copy may still sit
in the queue it was moved to as that runs out; the slot would then be handed over again
and the late copy, finding no reservation, would park again at the back of the line (a
churn of moves, parks and receipts). The broker's side of the line knows which copies
are still queued (its backup's check, ``parking/lua/restore.lua``); the worker's poll
passes them here, and one script per :data:`BATCH` keys (``lua/keep_late.lua``, on the
lock store's clock) keeps one reservation for each until :data:`KEEP_MS` from now, never
more than :data:`MOST_MS` past that reservation's first end: a copy that no worker ever
takes (its queue has no consumer) holds the slot that long at most, then it lapses and
is handed over again as before. A copy keeps the reservation it was first given here;
once that one is taken by another copy or lapsed, none other is kept for it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

from .scripts import KEEP_LATE, by_hash_slot

__all__ = ["BATCH", "KEEP_MS", "MOST_MS", "keep_late"]

#: How long (ms) from the look a late copy's reservation is kept: as long as a slot is
#: reserved at its hand-over. The next look (2 s later, by any worker's poll, each once
#: a second, or less often when a poll visits thousands of keys) comes well before.
KEEP_MS = 10 * 1000

#: The most (ms) a reservation is kept past the end it was given at its hand-over, in
#: all: copies queued ahead of a late one are moved copies too (each pushed to the
#: front), so its wait is at most the slots handed over at once over the workers' start
#: rate (12,000 at 200 starts/s); a copy that no worker takes holds a slot ~70 s.
MOST_MS = 60 * 1000

#: How many keys one script visits at most.
BATCH = 50


def keep_late(client: Any, late: Iterable[Tuple[str, str]]) -> int:
    """Keep the reservations of the late copies ``late`` (``(semaphore key, move id)``
    pairs). How many reservations were kept longer.

        >>> import redis
        >>> keep_late(redis.Redis.from_url(redis_url), [("doc:{x}:s:nobody", "0a1b")])
        0
    """
    by_key: Dict[str, List[str]] = {}
    for key, move in late:
        by_key.setdefault(key, []).append(move)
    kept = 0
    for group in by_hash_slot(client, list(by_key)):
        for start in range(0, len(group), BATCH):
            keys = group[start:start + BATCH]
            args: List[Any] = [KEEP_MS, MOST_MS]
            for key in keys:
                args += [len(by_key[key]), *by_key[key]]
            kept += int(KEEP_LATE.run(client, keys, args))
    return kept
