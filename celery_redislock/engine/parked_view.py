"""What an operator sees of a semaphore's parked line (``redislock_line = "broker"``):
counts only, read in one pipeline, never a walk of the line (it may hold 100,000).

The lock store keeps, per semaphore key K, the companions ``lua/parking.lua`` describes
in its header; this module reads them and writes nothing:

* ``'}:pn:'`` the line's counts: ``w`` references waiting, ``a`` anonymous entries
  (parked messages counted from the broker after the store lost its data);
* ``'}:pv:'`` reservations (number -> end, ms): slots handed to the line whose moved
  copy has not claimed them yet (live ones: their end is still ahead);
* ``'}:pc:'`` holder token -> the reference it claimed (moved, admitted, its body not
  started yet, or running under ``acks_late``); a claim whose holder's lease ran out
  unreleased lapses (``lua/parking.lua``'s ``lapse_claims``);
* ``'}:px:'`` served references (a list, in the order they were served, of when each
  is forgotten): kept so that a copy the broker gives back ends unrun; its length counts
  those not yet pruned (a few are pruned at each call of the line's scripts);
* the key space's index ``'<prefix>parked'`` (K -> when a run last parked there);
* for a fair limit (``fair_by``), ``'}:ft:'`` its sub-lines waiting (``lua/fair.lua``):
  only their number is read here (``ZCARD``, less the tenant ``""`` of a line that is
  not fair but whose runs wait in priority bands); :func:`.fair.fair_view` reads the
  first by turn.

The oldest waiter's age of the whole line cannot be read here: a reference's
``since`` is in the hash ``'}:pr:'``, and no structure orders waiting references by it
(finding the oldest would walk the line). :attr:`ParkedLine.oldest_age` is therefore
always None. (A fair line's sub-lines whose runs wait in priority bands do keep theirs:
:func:`.fair.oldest_waiters`.)

    >>> import redis
    >>> client = redis.Redis.from_url(redis_url)
    >>> seconds, micros = client.time()
    >>> read_parked_lines(client, ["doc:{x}:s:nobody"], seconds * 1000 + micros // 1000)
    {}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from .fair import fair_key
from .keys import companion_key

__all__ = [
    "CLAIMS",
    "COUNTS",
    "FAIR_TURNS",
    "READS_PER_KEY",
    "RESERVATIONS",
    "SERVED",
    "ParkedLine",
    "add_reads",
    "line_of",
    "parked_index_of",
    "read_parked_lines",
]

#: The marks of the parked line's companions, as ``lua/parking.lua`` names them in its
#: header (``parked_key(key, mark)``); the engine's Python does not export them.
#: ``tests/test_parked_view.py`` reads that header and fails if they drift.
COUNTS, CLAIMS, SERVED, RESERVATIONS = "pn", "pc", "px", "pv"

#: A fair line's sorted set of sub-lines waiting, as ``lua/fair.lua`` names it.
FAIR_TURNS = "ft"

#: The name of the key space's index of parked lines after the prefix
#: (``parked_index`` in ``lua/parking.lua``, :func:`~.parking.parked_index`).
INDEX_NAME = "parked"

#: How many commands :func:`add_reads` queues per key.
READS_PER_KEY = 7


@dataclass(frozen=True)
class ParkedLine:
    """The parked line of semaphore ``key`` at ``server_time_ms`` (server clock).

        >>> line = ParkedLine("k", 1000, references_waiting=7, anonymous=2, reserved=1)
        >>> line.waiting, line.oldest_age
        (9, None)
    """

    key: str
    server_time_ms: int
    #: References waiting (their copies parked in the broker).
    references_waiting: int = 0
    #: Parked messages the store counted from the broker (no reference known).
    anonymous: int = 0
    #: Live reservations: slots handed to the line, their moved copies still travelling.
    reserved: int = 0
    #: References claimed by a holder (moved and admitted; served once the body starts,
    #: or ends under ``acks_late``).
    claimed: int = 0
    #: Served references still kept (a copy given back by the broker ends unrun).
    served: int = 0
    #: When a run last parked on this key (ms), from the index; None if not indexed.
    last_parked_ms: Optional[int] = None
    #: Sub-lines of a fair limit (``fair_by``) with runs waiting (0: none, or not fair).
    fair_sub_lines: int = 0

    @property
    def waiting(self) -> int:
        """Runs waiting: references waiting and anonymous entries."""
        return self.references_waiting + self.anonymous

    @property
    def oldest_age(self) -> Optional[float]:
        """The oldest waiter's age: not kept by the lock store in a form readable in
        O(log n) (see the module), so always None."""
        return None

    @property
    def last_parked_age(self) -> Optional[float]:
        """Seconds since a run last parked on this key, if known."""
        if self.last_parked_ms is None:
            return None
        return max(0, self.server_time_ms - self.last_parked_ms) / 1000


def parked_index_of(key: str) -> Optional[str]:
    """The index of parked lines of ``key``'s key space (``parked_index`` in
    ``lua/parking.lua``), or None for a key without a hash tag.

        >>> parked_index_of("redislock:{85280b862f4ca735}:s:customer:42")
        'redislock:parked'
    """
    at = key.find("{")
    return None if at < 0 else key[:at] + INDEX_NAME


def add_reads(pipe: Any, key: str, now_ms: int) -> None:
    """Queue on ``pipe`` the :data:`READS_PER_KEY` reads of ``key``'s parked line (each
    O(1) or O(log n)); :func:`line_of` reads their replies."""
    now = f"({int(now_ms)}"
    pipe.hmget(companion_key(key, COUNTS), ["w", "a"])
    pipe.zcount(companion_key(key, RESERVATIONS), now, "+inf")
    pipe.hlen(companion_key(key, CLAIMS))
    pipe.llen(companion_key(key, SERVED))
    index = parked_index_of(key)
    if index is None:
        pipe.exists(key + ":no-index")  # keeps READS_PER_KEY replies per key
    else:
        pipe.zscore(index, key)
    pipe.zcard(fair_key(key, FAIR_TURNS))
    pipe.zscore(fair_key(key, FAIR_TURNS), "")  # a line that is not fair, in bands


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def line_of(key: str, replies: Sequence[Any], now_ms: int) -> Optional[ParkedLine]:
    """The :class:`ParkedLine` of ``key`` from the replies :func:`add_reads` queued, or
    None when the key has no parked line (nothing counted, reserved, claimed or kept)."""
    counts, reserved, claimed, served, indexed, turns, unfair = replies[:READS_PER_KEY]
    sub_lines = _int(turns) - (0 if unfair is None else 1)
    if all(value is None for value in counts) and not (reserved or claimed or served):
        return None
    last = None if indexed is None or isinstance(indexed, int) else int(float(indexed))
    return ParkedLine(key=key, server_time_ms=int(now_ms),
                      references_waiting=_int(counts[0]), anonymous=_int(counts[1]),
                      reserved=_int(reserved), claimed=_int(claimed),
                      served=_int(served), last_parked_ms=last,
                      fair_sub_lines=max(0, sub_lines))


def read_parked_lines(client: Any, keys: Sequence[str], now_ms: int) -> Dict[str, ParkedLine]:
    """``{key: ParkedLine}`` of the ``keys`` (semaphore keys) that have a parked line,
    in one pipeline; ``now_ms`` is the server's time (``TIME``), what reservations and
    served references are live against."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        add_reads(pipe, key, now_ms)
    replies: List[Any] = pipe.execute()
    found: Dict[str, ParkedLine] = {}
    for index, key in enumerate(keys):
        line = line_of(key, replies[index * READS_PER_KEY:(index + 1) * READS_PER_KEY],
                       now_ms)
        if line is not None:
            found[key] = line
    return found
