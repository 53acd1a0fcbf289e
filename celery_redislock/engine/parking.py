"""The lock store's side of the parked line: a refused run waits as ONE message in a
*parking queue* of the broker that no worker consumes, and the lock store keeps only a
reference to it and counts (``lua/parking.lua`` describes the keys).

A run is named by ``run_id(task_id, attempt)``. Its one admission call,
:func:`park_admit` (or :func:`prepare_park_admit` for a caller that sends the script
itself, as the worker's main process does), answers:

* :class:`~.admission.Lease`: admitted (a free slot and nobody waiting, or a moved copy
  that took the reservation made for it);
* :class:`~.admission.Busy` with ``park`` set: the refusal *wrote the run's reference*
  in the same script; the caller publishes the copy to ``park.key``'s parking queue with
  ``park.park_id`` in its header, then acknowledges the original. A copy whose reference
  is claimed by a live holder gets its own park id back: it goes back to parking as it is;
* :class:`~.admission.Served`: a stale copy (its reference is served, or names another
  park id): it ends without running;
* :class:`~.admission.Paused`: an operator paused a limit (nothing was written);
* :class:`GaveUp`: the run was parked longer than its ``max_wait`` (its reference was
  dropped, nothing is held): it fails with ``LockWaitTimeout``.

Hand-offs are :class:`~.admission.ParkedMove` entries: a release of a lease taken here
(``Lease.release``, ``release_handing_over``, ``release_soon``; the scripts
``release.lua``, ``wake.lua``, ``release_owner.lua`` too) reserves the freed slots
for the line and puts one ``ParkedMove(key)`` per move owed among the lease's hand-offs;
the worker's poll :func:`due` owes the moves of slots freed without a release. A move
that finds its parking queue empty calls :func:`moved_nothing`. Under default acks the
body's start calls :func:`started` (the reference becomes served; a release does it
too, for ``acks_late``).

Semantics are those of the executable model ``tests/waiting_model/store.py``, with two
choices it does not make:

* several semaphores (a global cap and a per-tenant key): all or nothing; the run parks
  at the FIRST semaphore that refuses it. A moved copy takes its reservation at its home
  (the semaphore it was parked at) and asks every other one as a newcomer; refused by
  another (full, or with waiters of its own), it parks there, and the reservation of its
  home is given back and handed over again at once (a ``ParkedMove`` in its answer).
  Likewise a moved copy that ends stale or goes back to parking gives its reservation
  back at once, rather than leaving it to lapse;
* a reference claimed by a holder whose lease ran out is not counted as waiting (that
  would take a scan): its copy, given back by the broker, asks again and then parks or
  takes a free slot. The claim itself lapses with the lease, on the server's clock,
  when the holder's release never came (the store did not answer it): claims are kept
  in a sorted set by their lease's end (renewals and the pool's adoption move it), a
  few trimmed at each admission and poll. The reference stays claimed by the dead
  holder as long as a served one is kept (``keep_served_ms``: a copy the broker gives
  back claims in its place), then is forgotten, unless a copy of the run went back to
  parking while the claim was live (kept for that copy). A late release finds nothing
  of its own: it frees no slot and serves nothing.

Slots of any cost (a slot handed to the line is reserved in units of its head's
cost: ``lua/parked_cost.lua``), and rate limits of any cost with them or alone
(``lua/parked_rates.lua``: a far start parks the run at the rate's line with its
promised start; see :mod:`.parking_rate`); on Redis Cluster a run whose limits lie in
one hash slot (the poll's index, in another slot, is written by a command of its own
after each script, :func:`local_index`, :func:`local_rate_index`).
:func:`prepare_park_admit` answers None for anything else: such a run is admitted by
``admit.lua`` and, refused, sent back with a countdown.

Cost (``benchmarks/bench_parking_store.py``: one private redis-server, the scripts'
own µs per call from ``INFO commandstats``, median of 3 rounds, 100 slots, task ids of
36 characters, a 2-core machine at load 2.7; 1,000 vs 100,000 references waiting on
the key, side by side): a newcomer admitted 68 vs 40 µs (today's ``admit.lua`` in the
same run: 67 vs 39), a refusal that parks 41 vs 37, a release that hands over 57 vs
51, a moved copy's claim 63 vs 71, ``started`` 19 vs 27, a poll of one key 43 vs 44:
no step grows with the line (the spread is the machine's load). Memory: 138 B per
waiting reference, 153 B per served reference (kept ``keep_served_ms``).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

from redis.exceptions import RedisError

from .admission import (
    SUB_MARK,
    Busy,
    Lease,
    Outcome,
    ParkedMove,
    ParkRef,
    Paused,
    RateLimit,
    Served,
    SlotLimit,
    _lease,
    grace_bound_ms,
    handoffs_of,
    milliseconds,
    new_token,
    saw_incarnation,
    seen_incarnation,
)
from .channel import channel_for
from .fair import with_band
from .scripts import (
    ADMIT_PARKED,
    DUE,
    FAIR_TOOK,
    LEAVE_PARKED,
    MOVED_NOTHING,
    PARKED_SENT,
    STARTED,
    LuaScript,
    by_hash_slot,
    is_cluster,
)

__all__ = [
    "DUE_BATCH", "KEEP_SERVED_MS", "RESERVE_MS", "DeadlineMove", "GaveUp", "ParkAdmitCall",
    "ParkAsk", "ParkRef", "ParkedMove", "copy_sent", "due", "leave", "moved_nothing", "moves_of",
    "park_admit", "parked_index", "parked_keys", "prepare_park_admit", "run_id", "started",
    "started_soon",
]

#: How long a served reference is kept (ms): as long as the broker may give back a copy
#: of the run (its visibility timeout; kombu's Redis transport: one hour).
KEEP_SERVED_MS = 3600 * 1000

#: How long a slot handed to a parked line stays reserved for the moved copy (ms).
RESERVE_MS = 10 * 1000

#: How long a fair sub-line's moves may find its parking queue empty before the count
#: of the copy they were owed for is dropped (ms; :func:`moved_nothing`): a copy is
#: published milliseconds after its refusal counted it.
PUBLISH_GRACE_MS = 2000

#: How many keys one script of the poll visits (:func:`due`, ``due_rate``): a script
#: holds the lock store for its whole run, and a key costs it about 60 µs, so that every
#: other client waits at most a few ms (500 keys held it 28-68 ms on a loaded machine).
DUE_BATCH = 50


def run_id(task_id: str, attempt: int) -> str:
    """The name of one attempt of a task in the parked line.

        >>> run_id("5f0c", 2)
        '5f0c:2'
    """
    return f"{task_id}:{int(attempt)}"


def parked_index(prefix: str = "redislock:") -> str:
    """The key of the index of semaphores with a parked line, for the key ``prefix``."""
    return f"{prefix}parked"


def rate_index(prefix: str = "redislock:") -> str:
    """The key of the index of rate keys with a parked line, for the key ``prefix``."""
    return f"{prefix}parked:rate"


@dataclass(frozen=True)
class GaveUp:
    """A parked run waited its ``max_wait`` (``lua/deadline.lua``): its reference at
    ``key`` was dropped and nothing is held; the run fails (``LockWaitTimeout``).
    ``since_ms``: when it was first refused (server ms).

        >>> GaveUp("crawl", "k", since_ms=1000, server_time_ms=6000).waited
        5.0
    """

    name: str
    key: str
    since_ms: int
    server_time_ms: int
    handoffs: List[Any] = field(default_factory=list)

    @property
    def waited(self) -> float:
        """How long it waited (s), on the lock store's clock."""
        return max(0, self.server_time_ms - self.since_ms) / 1000.0


@dataclass(frozen=True)
class DeadlineMove(ParkedMove):
    """A move the poll owes to give up a run parked past its ``max_wait``: the head of
    ``key``'s parking queue is moved with no slot reserved for it (a move that finds the
    queue empty gives nothing back). See ``lua/deadline.lua``.

        >>> moves_of([b"!late 1 k", b"!late 1 k\x1fa"])
        [DeadlineMove(key='k', sub=''), DeadlineMove(key='k', sub='a')]
    """


_LATE_MARK = "!late "


def moves_of(entries: Sequence[Any]) -> List[ParkedMove]:
    """The moves owed in a script's reply entries: :class:`ParkedMove` per ``!move``
    entry, :class:`DeadlineMove` per ``!late`` entry."""
    moves: List[ParkedMove] = []
    for entry in entries:
        text = entry.decode("utf-8", "surrogateescape") if isinstance(entry, bytes) else entry
        if isinstance(text, str) and text.startswith(_LATE_MARK):
            _, count, line = text.split(" ", 2)
            key, _, sub = line.partition(SUB_MARK)
            moves.extend(DeadlineMove(key, sub) for _ in range(int(count)))
        else:
            moves.extend(move for move in handoffs_of([entry])
                         if isinstance(move, ParkedMove))
    return moves


@dataclass(frozen=True)
class ParkAdmitCall:
    """One ``admit_parked.lua`` call: ``script``, ``keys`` and ``args`` to send
    (``EVALSHA``, as :class:`~.admission.AdmitCall`), and :meth:`outcome` to read its
    reply. Built by :func:`prepare_park_admit`."""

    client: Any
    limiters: Sequence[Union[SlotLimit, RateLimit]]
    token: str
    lease: float
    description: str
    reserve_ms: int
    keys: List[str]
    args: List[Any]

    @property
    def script(self) -> LuaScript:
        """The script to send: :data:`~.scripts.ADMIT_PARKED`."""
        return ADMIT_PARKED

    def run(self) -> Union[Outcome, GaveUp]:
        """Send the script and read its reply (blocking)."""
        return self.outcome(self.script.run(self.client, self.keys, self.args))

    def outcome(self, reply: Any) -> Union[Outcome, GaveUp]:
        """The outcome ``reply`` stands for: a Lease, Busy (with ``park``), Served or
        Paused, each with the moves owed (:class:`ParkedMove`) in ``handoffs``."""
        limiters = self.limiters
        if not isinstance(reply, list):  # "now_ms lease_end_ms fence contended last"
            text = reply.decode() if isinstance(reply, bytes) else str(reply)
            now_ms, lease_end, fence, contended, last = map(int, text.split())
            return self._lease(now_ms, lease_end, fence, contended, last, [])
        status, now_ms, index = int(reply[0]), int(reply[1]), int(reply[2])
        a, b, c, d = reply[3:7]
        handoffs = handoffs_of(reply[7:])
        limiter = limiters[index - 1] if index else limiters[0]
        if status == 1:
            return self._lease(now_ms, int(a), int(b), int(c), int(d), handoffs)
        if status == 7:
            park_id = d.decode() if isinstance(d, bytes) else str(d)
            if is_cluster(self.client):  # the key space's index: one command of its own
                space = rate_index if isinstance(limiter, RateLimit) else parked_index
                self.client.zadd(space(limiter.prefix), {limiter.key: now_ms})
            return Busy(name=limiter.name, holders=int(a), slots=getattr(limiter, "slots", 0),
                        retry_hint=max(0, int(b)) / 1000.0,
                        average_hold=None if int(c) < 0 else int(c) / 1000.0,
                        server_time_ms=now_ms, key=limiter.key, handoffs=handoffs,
                        park=ParkRef(limiter.key, park_id, getattr(limiter, "fair", "")))
        if status == 3:
            return Paused(name=limiter.name, key=limiter.key,
                          retry_hint=None if int(a) < 0 else max(0, int(a) - now_ms) / 1000.0,
                          server_time_ms=now_ms, handoffs=handoffs)
        if status == 4:
            return Served(name=limiter.name, server_time_ms=now_ms, handoffs=handoffs)
        if status == 5:
            return GaveUp(limiter.name, limiter.key, int(a), now_ms, handoffs)
        raise ValueError(f"admit_parked.lua answered status {status}")

    def _lease(self, now_ms: int, lease_end: int, fence: int, contended: int, last: int,
               handoffs: List[Any]) -> Lease:
        saw_incarnation(self.client, fence)
        return _lease(self.client, self.limiters, self.token, self.lease, self.description,
                      self.reserve_ms, now_ms, lease_end, fence, contended, last, handoffs)


def parks(client: Any, limiters: Sequence[Any]) -> bool:
    """Whether a run under ``limiters`` can wait on the parked line: semaphores (of any
    cost: ``lua/parked_cost.lua``), and rate limits of any cost with them or alone
    (``lua/parked_rates.lua``); on Redis Cluster, all in one hash slot (one limit, or a
    semaphore and a rate of one name: their keys share a hash tag)."""
    return (bool(limiters)
            and all(isinstance(limiter, (SlotLimit, RateLimit)) for limiter in limiters)
            and len(by_hash_slot(client, [limiter.key for limiter in limiters])) == 1)


def local_index(key: str) -> str:
    """On Redis Cluster, the index entry of semaphore ``key`` kept in its own hash slot
    (the scripts write it there; the key space's index, in another slot, is written
    after them by one command of its own).

        >>> local_index("redislock:{ab}:s:reports")
        'redislock:{ab}:pi:reports'
    """
    return key.replace("}:s:", "}:pi:", 1)


def local_rate_index(key: str) -> str:
    """On Redis Cluster, the index of the rate keys with a parked line kept in rate
    ``key``'s own hash slot (as :func:`local_index`; one per hash tag, the rate keys its
    members).

        >>> local_rate_index("redislock:{ab}:r:api")
        'redislock:{ab}:pir'
    """
    return key[:key.index("}:r:") + 1] + ":pir"


def rate_index_of(client: Any, prefix: str, key: str) -> str:
    """The index of rate keys the scripts of rate ``key`` write: the key space's, or on
    Redis Cluster the one in the key's own slot (:func:`local_rate_index`)."""
    return local_rate_index(key) if is_cluster(client) else rate_index(prefix)


def _index_of(client: Any, prefix: str, key: str) -> str:
    """The index key the scripts of ``key`` write: the key space's, or on Redis Cluster
    the key's own (:func:`local_index`; for a rate key, :func:`local_rate_index`)."""
    if not is_cluster(client):
        return parked_index(prefix)
    return local_rate_index(key) if "}:r:" in key else local_index(key)


def _seen(client: Any) -> int:
    """The incarnation to pass: on Redis Cluster -1 (its marker lies in another slot)."""
    return -1 if is_cluster(client) else seen_incarnation(client)


@dataclass(frozen=True)
class ParkAsk:
    """One run's ask of the parked line, in one value: what :func:`prepare_park_admit`
    (semaphores, with rate limits or not) and :func:`.parking_rate.prepare_rate_admit`
    (one rate limit alone) make a script call of, and :func:`park_admit` sends.

    * ``lease`` (s): the lease an admitted run holds; ``run``: :func:`run_id`;
    * ``parked``: the :class:`ParkRef` in the header of a copy moved out of parking
      (None for a copy never parked; a ref whose key is no longer among the limiters is
      ignored: the copy asks as a newcomer);
    * ``description``, ``owner``: the holder's description and its token's prefix;
    * ``keep_served_ms``: how long a served reference is kept (the broker's visibility
      timeout); ``reserve_ms``: how long a slot handed to the line stays reserved;
    * ``park_paused``: a semaphore an operator paused parks the run (Busy with ``park``,
      ``retry_hint`` the pause's remaining time, or 0 for none) instead of answering
      Paused; the poll hands its slots over once the pause ends;
    * ``max_wait`` (s): a run parked that long since it was first refused is given up
      (:class:`GaveUp`), found by the poll within about a poll of its deadline
      (``lua/deadline.lua``);
    * ``priority`` (higher first; None: none) puts the run in that band of its sub-line
      (:func:`.fair.with_band`): a slot handed to the line goes to the band whose oldest
      run has the lowest ``since - priority x priority_aging`` (s);
    * ``book_ms`` (one rate limit alone): how far ahead the caller holds a run for the
      start booked for it (0: it parks);
    * ``unsent_ms``: the caller publishes a refused run's copy itself, after the refusal,
      and confirms it (:func:`copy_sent`) within this many ms; unconfirmed by then, the
      reference lapses (``lua/parked_unsent.lua``: not counted as waiting, then
      forgotten), as when the caller died before its publish (0: no confirmation, the
      caller's message stays unacknowledged until its copy is parked);
    * ``copy``: a moved copy's id (the ``move`` of its wait header), for a task that
      late or early: its claim, then its served reference, keeps it, so that this very
      copy asking again (its admission's reply lost, or given back by the broker
      unacknowledged) runs again (as Celery runs it), while another copy of the same move
      ends unrun.

        >>> ask = ParkAsk(lease=30, run=run_id("5f0c", 0), max_wait=600)
        >>> ask.keep_served_ms == KEEP_SERVED_MS, ask.parked is None
        (True, True)
        >>> from dataclasses import replace
        >>> replace(ask, parked=ParkRef("k", "1:7")).parked.park_id
        '1:7'
    """

    lease: float
    run: str
    parked: Optional[ParkRef] = None
    description: str = ""
    owner: str = ""
    keep_served_ms: int = KEEP_SERVED_MS
    reserve_ms: int = RESERVE_MS
    park_paused: bool = False
    max_wait: Optional[float] = None
    priority: Optional[int] = None
    priority_aging: float = 10.0
    book_ms: int = 0
    copy: str = ""
    unsent_ms: int = 0


def prepare_park_admit(client: Any, limiters: Sequence[Any],
                       ask: ParkAsk) -> Optional[ParkAdmitCall]:
    """:func:`park_admit` as one script call for the caller to send (``EVALSHA`` of
    ``call.script`` with ``call.keys`` and ``call.args``, the reply read by
    ``call.outcome(reply)``; or ``call.run()``, blocking), or None when the run cannot
    wait on the parked line (see :func:`parks`): the caller asks :func:`.admission.admit`.

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> call = prepare_park_admit(client, [SlotLimit("prepare-doc", 1, "doc:")],
        ...                           ParkAsk(lease=5, run=run_id("t0", 0)))
        >>> lease = call.run()
        >>> type(lease).__name__, lease.release()
        ('Lease', True)
    """
    if not parks(client, limiters):
        return None
    rates = [limiter for limiter in limiters if isinstance(limiter, RateLimit)]
    limiters = [limiter for limiter in limiters if isinstance(limiter, SlotLimit)]
    if ask.priority is not None:
        limiters = [with_band(limiter, ask.priority) for limiter in limiters]
    keys = [limiter.key for limiter in limiters]
    prefix = (limiters or rates)[0].prefix
    rate_keys = [rate.key for rate in rates] + (
        [rate_index_of(client, prefix, rates[0].key)] if rates else [])
    home = _home(ask.parked, keys, rate_keys)
    token = ask.owner + new_token()
    args = [token, milliseconds(ask.lease), ask.description, ask.run, home,
            park_id_arg(ask.parked, ask.copy) if home else "",
            ask.keep_served_ms, ask.reserve_ms, *(limiter.slots for limiter in limiters),
            _seen(client), grace_bound_ms(client, ask.lease),
            ("1" if ask.park_paused else "0") + (f" {ask.unsent_ms}" if ask.unsent_ms else ""),
            *_optional_args(limiters, rates, ask)]
    index = _index_of(client, prefix, keys[0] if keys else rates[0].key)
    return ParkAdmitCall(client, [*limiters, *rates], token, ask.lease, ask.description,
                         ask.reserve_ms, [*keys, index, *rate_keys], args)


def park_id_arg(parked: Optional[ParkRef], copy: str) -> str:
    """The script's park id argument: the moved copy's park id, then its copy id.

        >>> park_id_arg(ParkRef("k", "1:7"), ""), park_id_arg(ParkRef("k", "1:7"), "c9")
        ('1:7', '1:7 c9')
    """
    if parked is None:
        return ""
    return f"{parked.park_id} {copy}" if copy and " " not in copy else parked.park_id


def _home(parked: Optional[ParkRef], keys: Sequence[str], rate_keys: Sequence[str]) -> int:
    """The position in the script's KEYS (1-based) of the line a moved copy was parked
    at, or 0: a newcomer, or a ref whose key is no longer among the run's limits."""
    if parked is not None and parked.key in keys:
        return keys.index(parked.key) + 1
    if parked is not None and parked.key in rate_keys:  # KEYS[N + 1 + j]
        return len(keys) + 1 + rate_keys.index(parked.key) + 1
    return 0


def _optional_args(limiters: Sequence[SlotLimit], rates: Sequence[RateLimit],
                   ask: ParkAsk) -> List[Any]:
    """The script's trailing arguments, each sent only when it or a later one is needed:
    the fair lines' sub-lines (fair.lua), the max wait, the priority's aging, the costs
    (parked_cost.lua), then each rate's interval, tolerance (µs) and cost
    (parked_rates.lua)."""
    weighted = bool(rates) or any(limiter.cost != 1 for limiter in limiters)
    groups: List[Tuple[bool, List[Any]]] = [
        (any(limiter.fair for limiter in limiters), [limiter.fair for limiter in limiters]),
        (ask.max_wait is not None,
         [milliseconds(ask.max_wait) if ask.max_wait is not None else ""]),
        (ask.priority is not None,
         [milliseconds(ask.priority_aging) if ask.priority is not None else ""]),
        (weighted, [limiter.cost for limiter in limiters]),
    ]
    needed = [index for index, (wanted, _) in enumerate(groups) if wanted]
    args = [value for _, values in groups[:needed[-1] + 1] for value in values] if needed else []
    return args + _rate_args(rates)


def _rate_args(rates: Sequence[RateLimit]) -> List[Any]:
    """Each rate's interval, tolerance (µs) and cost (parked_rates.lua)."""
    args: List[Any] = []
    for rate in rates:
        interval = rate.rate.interval * 1_000_000
        args.extend([repr(interval), repr(interval * rate.rate.burst), rate.cost])
    return args


def park_admit(client: Any, limiters: Sequence[Any], ask: Optional[ParkAsk] = None,
               **fields: Any) -> Union[Outcome, GaveUp]:
    """Admit the run of ``ask`` past every limit, or park it (one script; see the
    module): :func:`prepare_park_admit`, sent. The ask's fields may be given as keywords
    instead of ``ask`` (``lease=5, run=...`` for ``ParkAsk(lease=5, run=...)``).

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> limit = [SlotLimit("park-doc", 1, "doc:")]
        >>> first = park_admit(client, limit, ParkAsk(lease=5, run=run_id("t1", 0)))
        >>> second = park_admit(client, limit, lease=5, run=run_id("t2", 0))
        >>> type(first).__name__, second.park.key == limit[0].key
        ('Lease', True)
        >>> first.release(), first.handoffs == [ParkedMove(limit[0].key)]
        (True, True)
    """
    call = prepare_park_admit(client, limiters, ask or ParkAsk(**fields))
    if call is None:
        raise ValueError("park_admit: semaphores only (on Redis Cluster, in one hash slot)")
    return call.run()


def copy_sent(client: Any, park: ParkRef, run: str) -> bool:
    """Confirm that the copy of ``run``, parked as ``park`` by a caller that asked with
    ``unsent_ms`` (:class:`ParkAsk`), is in its parking queue: its reference no longer
    lapses (``lua/parked_unsent.lua``). False: it was not awaiting this confirmation
    (asked without ``unsent_ms``, or forgotten since).

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> limit = [SlotLimit("sent-doc", 1, "doc:")]
        >>> first = park_admit(client, limit, lease=5, run=run_id("t1", 0))
        >>> busy = park_admit(client, limit, lease=5, run=run_id("t2", 0), unsent_ms=30000)
        >>> copy_sent(client, busy.park, run_id("t2", 0)), first.release()
        (True, True)
    """
    return bool(PARKED_SENT.run(client, [park.key], [run, park.park_id]))


def parked_keys(client: Any, prefix: str = "redislock:") -> List[str]:
    """The semaphores that have (or recently had) a parked line, from the index: the
    keys for the poll (:func:`due`).

        >>> import redis
        >>> parked_keys(redis.Redis.from_url(redis_url), "nothing-parked:")
        []
    """
    return [key.decode() if isinstance(key, bytes) else key
            for key in client.zrange(parked_index(prefix), 0, -1)]


def due(client: Any, parked_lengths: Mapping[str, int], *, prefix: str = "redislock:",
        reserve_ms: int = RESERVE_MS, lease: float = 0.0) -> List[ParkedMove]:
    """The poll (each worker, every ~100-250 ms): the moves owed now, for slots freed
    without a release (a lease ran out, a reservation lapsed, the grace after a loss of
    the store's data ended). ``parked_lengths`` maps each semaphore key to its parking
    queue's length (-1 if unknown): pass every key of :func:`parked_keys` and of the
    broker's registry of parking queues. A key whose line knows nobody while its queue
    holds messages (the store lost its data) counts them as anonymous entries. A poll
    that is the first to find the store emptied starts the grace (the longest lease
    declared, see :func:`~.admission.declare_longest_lease`, or ``lease``), as an
    admission would: nothing is handed over until it ends. One script per
    :data:`DUE_BATCH` keys.

        >>> import redis
        >>> due(redis.Redis.from_url(redis_url), {"doc:{x}:s:nobody": 0}, prefix="doc:")
        []
    """
    moves: List[ParkedMove] = []
    keys = list(parked_lengths)
    if is_cluster(client):
        return _due_on_cluster(client, parked_lengths, prefix, reserve_ms, lease)
    for start in range(0, len(keys), DUE_BATCH):
        batch = keys[start:start + DUE_BATCH]
        reply = DUE.run(client, [*batch, parked_index(prefix)],
                        [reserve_ms, seen_incarnation(client),
                         grace_bound_ms(client, lease or 0.001),
                         *(int(parked_lengths[key]) for key in batch)])
        saw_incarnation(client, int(reply[0]))
        moves.extend(moves_of(reply[1:]))
    return moves


def _due_on_cluster(client: Any, parked_lengths: Mapping[str, int], prefix: str,
                    reserve_ms: int, lease: float) -> List[ParkedMove]:
    """:func:`due` on Redis Cluster: one script per key (its own hash slot, its own
    index entry, :func:`local_index`), then the key space's index brought in line with
    that entry by one command."""
    moves: List[ParkedMove] = []
    index = parked_index(prefix)
    for key in parked_lengths:
        reply = DUE.run(client, [key, local_index(key)],
                        [reserve_ms, -1, grace_bound_ms(client, lease or 0.001),
                         int(parked_lengths[key])])
        moves.extend(moves_of(reply[1:]))
        when = client.zscore(local_index(key), key)
        if when is None:
            client.zrem(index, key)
        else:
            client.zadd(index, {key: when})
    return moves


def moved_nothing(client: Any, key: str, sub: str = "",
                  publish_grace_ms: int = PUBLISH_GRACE_MS, reserved: bool = True) -> bool:
    """A move out of ``key``'s parking queue found it empty: the reservation it was for
    is given back at once (and anonymous entries dropped). A move owed from a fair
    line's sub-line ``sub`` counts its copy again, at the sub-line's own turn (not
    first), while the sub-line's moves have found its queue empty for less than
    ``publish_grace_ms`` (the copy not published yet); past that the count is dropped (a
    sub-line counted waiting with nothing parked would otherwise attract later moves),
    and a copy that still comes is moved from the line's own queue. A move for which no
    slot was reserved (a standby's, not ``reserved``) gives none back: the live
    reservations are other moves'. True if a reservation was given back.

        >>> import redis
        >>> moved_nothing(redis.Redis.from_url(redis_url), "doc:{x}:s:nobody")
        False
    """
    return bool(int(MOVED_NOTHING.run(client, [key],
                                      [sub, publish_grace_ms, 1 if reserved else 0])))


def took_from_sub_line(client: Any, key: str, sub: str) -> bool:
    """A move owed from ``key``'s own queue took its message from the fair line's
    sub-line ``sub`` (the mover's fall-back): that sub-line counts one copy less, if it
    counted any, so that it is not left counted as waiting with nothing parked. True if
    it counted one less.

        >>> import redis
        >>> took_from_sub_line(redis.Redis.from_url(redis_url), "doc:{x}:s:nobody", "t")
        False
    """
    return bool(int(FAIR_TOOK.run(client, [key], [sub])))


def started(lease: Lease) -> int:
    """The body of ``lease``'s run started and its message was acknowledged (default
    acks): the reference it claimed becomes served (kept ``keep_served_ms``, so a copy
    of the run given back later ends unrun). A release does the same (``acks_late``).
    How many references became served (0 for a run that was never parked).

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> lease = park_admit(client, [SlotLimit("started-doc", 1, "doc:")], lease=5,
        ...                    run=run_id("t3", 0))
        >>> started(lease), lease.release()
        (0, True)
    """
    keys = [key for part in (lease._parts or [lease]) for key in part._keys]
    if not keys:
        return 0
    return int(STARTED.run(lease._client, keys, [lease.token]))


def started_soon(lease: Lease, on_error: Callable[[RedisError], None]) -> None:
    """:func:`started`, written now and not waited for: its answer is read with this
    thread's next request to the lock store (usually the run's release), so that the
    body starts a round trip sooner. The request is written before the body starts; until
    the holder's claim ends, the claim itself keeps any other copy of the run from
    running, and the mark matters only should the holder die. The first call on a
    connection pool, and any call that finds no channel, waits (the script is loaded
    so); an error in the answer (the script unknown to a restarted store, the store
    unreachable) marks it again blocking, else goes to ``on_error`` (the release marks
    the reference served anyway)::

        started_soon(lease, lambda exc: logger.warning("not marked: %s", exc))
    """
    keys = [key for part in (lease._parts or [lease]) for key in part._keys]
    if not keys:
        return
    client = lease._client
    channel = channel_for(client) if not lease._parts else None
    pool = getattr(client, "connection_pool", None)
    if channel is None or pool not in _started_known:
        try:
            STARTED.run(client, keys, [lease.token])
        except RedisError as exc:
            on_error(exc)
        else:
            if channel is not None:
                _started_known.add(pool)
        return

    def answered(replies: List[Any]) -> None:
        if isinstance(replies[0], RedisError):
            _started_known.discard(pool)
            try:
                STARTED.run(client, keys, [lease.token])
            except RedisError as exc:
                on_error(exc)

    try:
        channel.send((*STARTED.evalsha(client), len(keys), *keys, lease.token), then=answered)
    except RedisError as exc:  # not written: no answer comes
        answered([exc])


#: The connection pools whose server has ``started.lua`` (this process ran it once).
_started_known: weakref.WeakSet[Any] = weakref.WeakSet()
os.register_at_fork(after_in_child=_started_known.clear)


def leave(client: Any, park: ParkRef, run: str, *, moved: bool = True,
          reserve_ms: int = RESERVE_MS) -> List[ParkedMove]:
    """A parked run leaves its line without running (its moved copy was revoked or had
    expired, or it gave up): its reference is dropped if it still waits under
    ``park.park_id``, and a copy that was ``moved`` out of parking gives back the
    reservation it was moved for. The moves owed (that slot handed over again).

        >>> import redis
        >>> leave(redis.Redis.from_url(redis_url), ParkRef("doc:{x}:s:nobody", "1:1"), "t:0")
        []
    """
    reply = LEAVE_PARKED.run(client, [park.key],
                             [run, park.park_id, "1" if moved else "0", reserve_ms])
    return [move for move in handoffs_of(reply[1:]) if isinstance(move, ParkedMove)]
