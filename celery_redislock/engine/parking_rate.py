"""The parked line of a rate limit: a run whose promised start is far waits as ONE message
in its rate key's *parking queue* (never a copy sent back with a countdown), and the lock
store keeps its reference and a FIFO of the promised starts (``lua/rate_parked.lua``
describes the keys).

* :func:`prepare_rate_admit` (or :func:`rate_park_admit`, blocking) is the admission's
  one script: admitted now (:class:`~.admission.Lease`), booked for a start within
  ``book_ms`` (:class:`~.admission.Booked`: the caller holds the run and starts it without
  asking), parked (:class:`~.admission.Busy` with ``park`` set: publish the copy to
  ``park.key``'s parking queue, then acknowledge the original; a rate an operator paused
  parks the run too, promised a start by the poll once the pause ends) or stale
  (:class:`~.admission.Served`);
* :func:`due_rate`, each worker's poll: one :class:`~.admission.ParkedMove` per parked
  copy whose promised start is due within :data:`LEAD_MS` (the heads of the FIFO); the
  moved copy asks with its :class:`~.admission.ParkRef` and takes the first start the
  GCRA allows, now or booked. Its traffic does not grow with the line: one script per
  :data:`~.parking.DUE_BATCH` keys a poll, O(moves) entries read. A run with a
  ``max_wait`` is given up (:class:`~.parking.GaveUp`) within about a poll of its
  deadline, as on a semaphore's line (``lua/deadline.lua``: a
  :class:`~.parking.DeadlineMove` of the head); its start
  goes back to the line (the last promised one: the runs behind it move up).

The GCRA is admit.lua's: a start counts in ``tat`` when admitted or booked, a newcomer
passes only when no promised start is ahead of it, each start is promised to one run.
One rate limiter of cost 1 and nothing else (:func:`rate_parks`). On Redis Cluster the
scripts keep the rate key's entry of the poll's index in its own hash slot
(:func:`~.parking.local_rate_index`), and the key space's index is written after them by
one command of its own, as for semaphores.

Other runs with a rate limit (with semaphores, several rate limits, a cost above 1) park
on the same rate lines through :func:`.parking.park_admit` (``admit_parked.lua`` with
``lua/parked_rates.lua``): all or nothing across every limit in one script, on the
server's clock. The semaphores decide first; admitted by them, the rates decide, and a
start not allowed now parks the run at the rate whose start is latest, promised that
start, which every rate's line moves past (nobody else is promised it); a semaphore
reservation the copy took is given back and handed over at once: it holds nothing while it
waits, as one message. The moved copy has its turn: it asks the semaphores as a newcomer,
and refused there parks at the semaphore *keeping* its turn (its rate reference becomes
``t``): when a slot moves it, it needs only each rate's GCRA, and gets no new start at the
end of the line. A copy with a turn that a GCRA still refuses (moved early, within the
poll's lead) parks again at the head of that rate's FIFO. No booking on that path (a start
is never held with a slot): a near start parks and the poll moves it within a poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Union

from .admission import (
    Busy,
    Lease,
    Outcome,
    ParkedMove,
    ParkRef,
    Paused,
    RateLimit,
    Served,
    _booked,
    _lease,
    milliseconds,
    new_token,
)
from .parking import (
    DUE_BATCH,
    GaveUp,
    ParkAsk,
    local_rate_index,
    moves_of,
    park_id_arg,
    rate_index,
    rate_index_of,
)
from .scripts import LINE, LuaScript, is_cluster

__all__ = ["LEAD_MS", "RateAdmitCall", "due_rate", "is_rate_key", "prepare_rate_admit",
           "rate_index", "rate_park_admit", "rate_parked_keys", "rate_parks"]

RATE_PARKED = LuaScript.load("rate_parked.lua", after=LINE)
DUE_RATE = LuaScript.load("due_rate.lua", after=LINE)

#: How long (ms) before its promised start the poll moves a parked copy: with a poll
#: every 200 ms it reaches a worker 0.2-0.4 s before its start, which it is held for there.
LEAD_MS = 400

#: The most moves owed per rate key and poll.
MOST_MOVES = 200


def is_rate_key(key: str) -> bool:
    """Whether ``key`` is a rate limiter's key (its line is this module's).

        >>> is_rate_key("redislock:{ab}:r:api"), is_rate_key("redislock:{ab}:s:api")
        (True, False)
    """
    return "}:r:" in key


def rate_parks(client: Any, limiters: Sequence[Any]) -> bool:
    """Whether a run under ``limiters`` can wait on a rate limit's parked line: one rate
    limiter of cost 1 and nothing else."""
    return (len(limiters) == 1 and isinstance(limiters[0], RateLimit)
            and limiters[0].cost == 1)


@dataclass(frozen=True)
class RateAdmitCall:
    """One ``rate_parked.lua`` call: ``script``, ``keys`` and ``args`` to send, and
    :meth:`outcome` to read its reply (as :class:`~.parking.ParkAdmitCall`)."""

    client: Any
    limiters: Sequence[RateLimit]
    token: str
    lease: float
    description: str
    keys: List[str]
    args: List[Any]

    @property
    def script(self) -> LuaScript:
        """The script to send."""
        return RATE_PARKED

    def run(self) -> Union[Outcome, GaveUp]:
        """Send the script and read its reply (blocking)."""
        return self.outcome(self.script.run(self.client, self.keys, self.args))

    def outcome(self, reply: Any) -> Union[Outcome, GaveUp]:
        """The outcome ``reply`` stands for: Lease, Booked, Busy (with ``park``), Served,
        Paused or GaveUp."""
        limiter = self.limiters[0]
        if not isinstance(reply, list):  # "now_ms lease_end_ms 0 contended last"
            text = reply.decode() if isinstance(reply, bytes) else str(reply)
            now_ms, lease_end = map(int, text.split()[:2])
            return self._lease(now_ms, lease_end)
        status, now_ms = int(reply[0]), int(reply[1])
        a, b, c, d = reply[3:7]
        if status == 6:
            start_ms = int(a) // 1000
            return _booked(limiter, self._lease(start_ms, start_ms + milliseconds(self.lease)),
                           int(b), int(c), now_ms, [])
        if status == 7:
            park_id = d.decode() if isinstance(d, bytes) else str(d)
            if is_cluster(self.client):  # the key space's index: one command of its own
                self.client.zadd(rate_index(limiter.prefix), {limiter.key: now_ms})
            return Busy(name=limiter.name, holders=0, slots=0,
                        retry_hint=max(0, int(b)) / 1000.0, average_hold=None,
                        server_time_ms=now_ms, key=limiter.key,
                        park=ParkRef(limiter.key, park_id))
        if status == 3:
            return Paused(name=limiter.name, key=limiter.key,
                          retry_hint=None if int(a) < 0 else max(0, int(a) - now_ms) / 1000.0,
                          server_time_ms=now_ms)
        if status == 4:
            return Served(name=limiter.name, server_time_ms=now_ms)
        if status == 5:
            return GaveUp(limiter.name, limiter.key, int(a), now_ms)
        raise ValueError(f"rate_parked.lua answered status {status}")

    def _lease(self, now_ms: int, lease_end: int) -> Lease:
        return _lease(self.client, self.limiters, self.token, self.lease, self.description,
                      0, now_ms, lease_end, 0, 1, 0, [])


def prepare_rate_admit(client: Any, limiters: Sequence[Any],
                       ask: ParkAsk) -> Optional[RateAdmitCall]:
    """The admission's one script call for the run of ``ask`` (its lease, run, parked
    copy's ref, holder, served references' keep, booking and max wait; a rate an
    operator paused always parks the run, and a rate line has no priority bands), or
    None when the run cannot wait on a rate limit's parked line (see
    :func:`rate_parks`)."""
    if not rate_parks(client, limiters):
        return None
    limiter, parked = limiters[0], ask.parked
    interval = limiter.rate.interval * 1_000_000
    park_id = (park_id_arg(parked, ask.copy)
               if parked is not None and parked.key == limiter.key else "")
    args = [ask.run, park_id, ask.keep_served_ms, int(ask.book_ms), repr(interval),
            repr(interval * limiter.rate.burst), milliseconds(ask.lease),
            "" if ask.max_wait is None else milliseconds(ask.max_wait)]
    return RateAdmitCall(client, list(limiters), ask.owner + new_token(), ask.lease,
                         ask.description,
                         [limiter.key, rate_index_of(client, limiter.prefix, limiter.key)],
                         args)


def rate_park_admit(client: Any, limiters: Sequence[Any], ask: Optional[ParkAsk] = None,
                    **fields: Any) -> Union[Outcome, GaveUp]:
    """Admit the run of ``ask`` past its rate limit, book it a start, or park it (one
    script): :func:`prepare_rate_admit`, sent. The ask's fields may be given as keywords
    instead of ``ask``.

        >>> import redis
        >>> from celery_redislock.engine.rate import Rate
        >>> client = redis.Redis.from_url(redis_url)
        >>> limit = [RateLimit("rate-park-doc", Rate.parse("1/10s", burst=0), "doc:")]
        >>> first = rate_park_admit(client, limit, ParkAsk(lease=5, run="t1:0"))
        >>> second = rate_park_admit(client, limit, lease=5, run="t2:0")
        >>> type(first).__name__, second.park.key == limit[0].key
        ('Lease', True)
    """
    call = prepare_rate_admit(client, limiters, ask or ParkAsk(**fields))
    if call is None:
        raise ValueError("rate_park_admit: one rate limiter of cost 1")
    return call.run()


def rate_parked_keys(client: Any, prefix: str = "redislock:") -> List[str]:
    """The rate keys that have (or recently had) a parked line, from the index."""
    return [key.decode() if isinstance(key, bytes) else key
            for key in client.zrange(rate_index(prefix), 0, -1)]


def due_rate(client: Any, parked_lengths: Mapping[str, int], *, prefix: str = "redislock:",
             lead_ms: int = LEAD_MS) -> List[ParkedMove]:
    """The poll: one :class:`ParkedMove` per parked copy whose promised start is due
    within ``lead_ms``, and one :class:`~.parking.DeadlineMove` per run parked past its
    max wait. ``parked_lengths`` maps each rate key to its parking queue's
    length (-1 if unknown); a queue that holds messages no promise stands for (the
    store lost its data) gets promised starts for them. One script per
    :data:`~.parking.DUE_BATCH` keys.

        >>> import redis
        >>> due_rate(redis.Redis.from_url(redis_url), {"doc:{x}:r:nobody": 0}, prefix="doc:")
        []
    """
    if is_cluster(client):
        return _due_rate_on_cluster(client, parked_lengths, prefix, lead_ms)
    moves: List[ParkedMove] = []
    keys = list(parked_lengths)
    for start in range(0, len(keys), DUE_BATCH):
        batch = keys[start:start + DUE_BATCH]
        reply = DUE_RATE.run(client, [*batch, rate_index(prefix)],
                             [lead_ms * 1000, MOST_MOVES,
                              *(int(parked_lengths[key]) for key in batch)])
        moves.extend(moves_of(reply[1:]))
    return moves


def _due_rate_on_cluster(client: Any, parked_lengths: Mapping[str, int], prefix: str,
                         lead_ms: int) -> List[ParkedMove]:
    """:func:`due_rate` on Redis Cluster: one script per key (its own hash slot, its own
    index entry, :func:`~.parking.local_rate_index`), then the key space's index brought
    in line with that entry by one command."""
    moves: List[ParkedMove] = []
    index = rate_index(prefix)
    for key in parked_lengths:
        local = local_rate_index(key)
        reply = DUE_RATE.run(client, [key, local],
                             [lead_ms * 1000, MOST_MOVES, int(parked_lengths[key])])
        moves.extend(moves_of(reply[1:]))
        when = client.zscore(local, key)
        if when is None:
            client.zrem(index, key)
        else:
            client.zadd(index, {key: when})
    return moves
