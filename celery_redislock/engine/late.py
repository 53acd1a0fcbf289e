"""Moved copies that are late, not lost: their reservations kept while they wait.

A slot handed to a parked line is reserved for the moved copy for
:data:`~.parking.RESERVE_MS` (10 s). When the workers are busy the copy may still sit
in the queue it was moved to as that runs out; the slot would then be handed over again
and the late copy, finding no reservation, would park again at the back of the line (a
churn of moves, parks and receipts). The broker's side of the line knows which copies
are still queued (its backup's check, ``parking/lua/restore.lua``, every 2 s per copy);
the worker's poll passes them here, and one script per :data:`BATCH` keys
(``lua/keep_late.lua``, on the lock store's clock) keeps one reservation for each until
:data:`KEEP_MS` from now.

Why no fixed bound while a copy is seen (the design chosen over sizing a bound from the
measured start rate): a copy waits behind the copies queued ahead of it, which the
workers start at whatever rate the load allows; any bound sized from a rate measured
before is wrong when the rate falls (two CPU burners made 5,000 copies wait ~170 s,
past the earlier 60 s bound, and 2.38 slots were handed per run). The broker knows, at
every look, that the copy is still there: the key's turn is the copy's as long as it
is seen, and the key's slot is not handed on meanwhile. The bounds:

* a copy a worker received takes the reservation tied to it and is forgotten as a
  late copy at once (``parking.lua``'s ``take_reservation``): its run's end hands the
  slot on to the next run, not back to it (before, a slot freed within 4 s of its last
  look was reserved for it again, though it had run: 1.55 slots handed per run);
* a copy no look names any more (lost and put back at the front of its parking queue)
  holds the slot :data:`KEEP_MS` after the last look;
* a copy is named only while some running worker consumes its queue (each worker's
  poll says which, renewed each second and lapsing after
  :data:`~celery_redislock.parking.redis_line.CONSUMED_MS`): a copy in a queue no
  worker consumes any more holds its slot ~20 s at most;
* a copy in a queue too long to look in (over 1,000 entries) is only presumed there:
  kept at most :data:`PRESUMED_MS` after it was last seen (or first named), so that a
  copy lost from a queue that stays long (its worker killed between kombu's pop and its
  unacked record) holds its slot no longer than that.

A copy keeps the reservation it was tied to while that is live; once another copy took
it, or it lapsed (a look too late, a move made after its reservation ended), the copy
is tied to another live reservation of its key that no other copy seen holds.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

from .scripts import KEEP_LATE, by_hash_slot

__all__ = ["BATCH", "KEEP_MS", "PRESUMED_MS", "keep_late"]

#: How long (ms) from the look a late copy's reservation is kept: as long as a slot is
#: reserved at its hand-over. The next look (2 s later, by any worker's poll, each once
#: a second, or less often when a poll visits thousands of keys) comes well before.
KEEP_MS = 10 * 1000

#: The most (ms) a copy only presumed in its queue (too long to look in) is kept past
#: its last sighting, or its first look if never seen: long enough for a queue of
#: 10,000 copies to drain to where they are looked for at ~20 starts/s.
PRESUMED_MS = 10 * 60 * 1000

#: How many keys one script visits at most.
BATCH = 50


def keep_late(client: Any, late: Iterable[Tuple[str, str]],
              presumed: Iterable[Tuple[str, str]] = ()) -> int:
    """Keep the reservations of the late copies ``late`` (``(semaphore key, move id)``
    pairs, each seen in its queue) and ``presumed`` (in a queue too long to look in).
    How many reservations were kept longer.

        >>> import redis
        >>> keep_late(redis.Redis.from_url(redis_url), [("doc:{x}:s:nobody", "0a1b")])
        0
    """
    by_key: Dict[str, List[str]] = {}
    for key, move in late:
        by_key.setdefault(key, []).append(move)
    for key, move in presumed:
        by_key.setdefault(key, []).append("~" + move)
    kept = 0
    for group in by_hash_slot(client, list(by_key)):
        for start in range(0, len(group), BATCH):
            keys = group[start:start + BATCH]
            args: List[Any] = [KEEP_MS, PRESUMED_MS]
            for key in keys:
                args += [len(by_key[key]), *by_key[key]]
            kept += int(KEEP_LATE.run(client, keys, args))
    return kept
