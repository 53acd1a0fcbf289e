"""One round trip that admits a run past every limit on it, or says why not.

A run may be held back by concurrency limits (:class:`SlotLimit`, a leased semaphore)
and rate limits (:class:`RateLimit`, GCRA), over any number of keys. ``admit.lua`` checks
them all and then takes all of them, or none: a run never holds one slot while it waits
for another.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from redis.exceptions import RedisError

from .channel import channel_for
from .holder import holder_member, unit_members
from .keeper import lease_keeper
from .keys import rate_key, semaphore_key
from .rate import Rate
from .refusal import describe_error, is_transient
from .scripts import (
    ADMIT,
    ADMIT_RATE,
    ADMIT_SLOTS,
    ADOPT,
    FOLLOW,
    FRESH,
    REFUND,
    RELEASE,
    RENEW,
    WAKE,
    by_hash_slot,
    is_cluster,
)

logger = logging.getLogger(__name__)

#: The member of a semaphore that marks it contended (a run was refused, or parked; see
#: ``admit.lua``, ``parking.lua``): a semaphore with a parked line always has it.
CONTENDED = "#hold"


@dataclass(frozen=True)
class SlotLimit:
    """At most ``slots`` slots of the semaphore ``name`` taken at once; a run admitted by
    this limiter takes ``cost`` of them (at most ``slots``), all at once or none.
    ``fair``: the run's sub-line when the limit's line is served round-robin across the
    keys of another template (``fair_by``; "" for none, a plain first come first served
    line); see :mod:`.fair`."""

    name: str
    slots: int
    prefix: str
    cost: int = 1
    fair: str = ""
    key: str = field(init=False, repr=False, compare=False)
    _spec: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", semaphore_key(self.name, self.prefix))
        weight = "" if self.cost == 1 else f":{self.cost}"
        object.__setattr__(self, "_spec", f"s:{self.slots}{weight}")

    def spec(self, promises: Mapping[str, int]) -> str:
        return self._spec


@dataclass(frozen=True)
class RateLimit:
    """Starts of ``name`` spaced to ``rate``, across every process; a start of this
    limiter uses ``cost`` of the rate's starts at once (at most ``burst + 1``)."""

    name: str
    rate: Rate
    prefix: str
    cost: int = 1
    key: str = field(init=False, repr=False, compare=False)
    _cost: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", rate_key(self.name, self.prefix))
        object.__setattr__(self, "_cost", "" if self.cost == 1 else f":{self.cost}")

    @property
    def start_us(self) -> float:
        """What one start of this limiter uses of the rate (µs): its interval times its
        cost; what a start given back (``refund.lua``) takes out of the count."""
        return self.rate.interval * 1_000_000 * self.cost

    def spec(self, promises: Mapping[str, int]) -> str:
        interval = self.rate.interval * 1_000_000
        tolerance = interval * self.rate.burst
        return f"r:{interval!r}:{tolerance!r}:{int(promises.get(self.key, 0))}{self._cost}"


Limiter = Union[SlotLimit, RateLimit]


def handed_young(record: Mapping[str, Any]) -> bool:
    """Whether the lease of a :meth:`Lease.handover` record was taken, on this machine,
    less than a third of a lease ago (by the monotonic clock): it cannot have run out,
    and needs no renewal yet."""
    taken = float(record.get("taken") or "-inf")
    return time.monotonic() - taken < float(record["lease"]) / 3


@dataclass
class Lease:
    """One holder's slots: what an admission hands out.

    ``fence`` is the fencing number of this acquisition: it is higher than every earlier
    acquisition's of the same semaphores, so a downstream system that remembers the
    highest number it has seen can refuse writes from an older holder whose lease ran out
    while it was paused. ``lost`` turns true when a renewal found that the lease had
    already ended.
    """

    name: str
    fence: int
    lease_seconds: float
    acquired_at_ms: int
    expires_at_ms: int
    lost: bool = False
    _client: Any = field(default=None, repr=False, compare=False)
    _keys: List[str] = field(default_factory=list, repr=False, compare=False)
    _member: str = field(default="", repr=False, compare=False)
    _taken_at: float = field(default_factory=time.monotonic, repr=False, compare=False)
    _contended: bool = field(default=True, repr=False, compare=False)
    #: The admission took the last free slot: whoever asked next was refused and waits
    #: for this release, so it waits for its answer, which hands the slot over.
    _took_last_slot: bool = field(default=True, repr=False, compare=False)
    #: How long a slot this lease frees is reserved for a parked line (ms); 0: no
    #: hand-off.
    _reserve_ms: int = field(default=0, repr=False, compare=False)
    #: The moves owed to parked lines handed a slot by this lease's release
    #: (:class:`ParkedMove`): the caller moves their parked runs (see :mod:`.parking`).
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)
    #: On Redis Cluster, one lease per hash slot that the run's limits span.
    _parts: List[Lease] = field(default_factory=list, repr=False, compare=False)
    #: The store's incarnation this lease belongs to (see ``store.lua``): 0 for the
    #: one it was granted in (its fence says when), else the one it was re-asserted in.
    _epoch: int = field(default=0, repr=False, compare=False)
    #: The slots taken in each semaphore of ``_keys`` (a weighted run's cost); empty
    #: when every one is 1. A cost above 1 is held as that many members (``units.lua``).
    _costs: List[int] = field(default_factory=list, repr=False, compare=False)
    #: A release of it was sent (see :meth:`_adopted`).
    _given_back: bool = field(default=False, repr=False, compare=False)
    #: An adoption sent without waiting whose answer was an error (the lock store
    #: restarted, a connection it broke): ``adopt.lua``'s arguments, until the adoption
    #: is done again (see :meth:`_finish_adoption`); empty otherwise.
    _adoption: List[Any] = field(default_factory=list, repr=False, compare=False)

    @property
    def token(self) -> str:
        """The holder token: unique to this acquisition."""
        return self._member.split(" ", 1)[0]

    @property
    def costs(self) -> List[int]:
        """The slots this lease takes in each of its semaphores (1 each, unless weighted)."""
        if self._parts:
            return [cost for part in self._parts for cost in part.costs]
        return list(self._costs) or [1] * len(self._keys)

    def _members(self, index: int) -> List[str]:
        """This holder's members in semaphore ``index``: its entry and its units."""
        if not self._costs:
            return [self._member]
        return [self._member, *unit_members(self.token, self._costs[index])]

    @property
    def holds_slots(self) -> bool:
        """False for a run admitted by rate limits only: nothing to renew or release."""
        return bool(self._keys) or any(part.holds_slots for part in self._parts)

    def renew(self) -> bool:
        """Extend the lease by ``lease_seconds`` from now; False (and ``lost``) if it had ended."""
        if self._parts:
            renewed = [part.renew() for part in self._parts]
            self.lost = self.lost or not all(renewed)
            return all(renewed)
        if not self._keys:
            return True
        if self._adoption:
            return self._finish_adoption()
        return self._renew_member()

    def _renew_member(self) -> bool:
        """:meth:`renew` of this lease's own member, in one script (``renew.lua``)."""
        lease_end, lost, *reasserted = RENEW.run(
            self._client, self._keys,
            [self._member, milliseconds(self.lease_seconds),
             0 if is_cluster(self._client) else self._epoch or self.fence,
             grace_bound_ms(self._client, self.lease_seconds), *self._costs],
        )
        if lost:
            self.lost = True
            return False
        if reasserted and int(reasserted[0]):
            # The store lost its data; this lease was written back into the new one.
            self._epoch = int(reasserted[0])
            saw_incarnation(self._client, self._epoch)
            logger.warning(
                "celery-redislock: the lock store lost its data; holder %s re-asserted "
                "its lease on %r (fence %s)", self.token, self.name, self.fence,
            )
        self.expires_at_ms = int(lease_end)
        return True

    def handover(self) -> Dict[str, Any]:
        """What another process needs to :meth:`adopt` this lease (plain data)."""
        return {"name": self.name, "fence": self.fence, "lease": self.lease_seconds,
                "at": self.acquired_at_ms, "end": self.expires_at_ms, "keys": self._keys,
                "member": self._member, "contended": self._contended,
                "last": self._took_last_slot, "reserve": self._reserve_ms,
                "epoch": self._epoch, "costs": self._costs,
                "parts": [part.handover() for part in self._parts],
                "taken": self._taken_at}

    @classmethod
    def adopt(cls, client: Any, record: Mapping[str, Any], description: str, *,
              answer_later: bool = False) -> Optional[Lease]:
        """Take over the lease another process was admitted to (see :meth:`handover`),
        under this process's ``description``; renewed from now. None when it has no
        live lease left (it ran out before it was adopted): the caller must ask anew.

        With ``answer_later``, a lease taken on this machine less than a third of a
        lease ago (it cannot have run out yet) is adopted without waiting: the request
        is written now (before the caller starts the body: the worker's recovery frees
        a holder that names no process at once), its answer read at this thread's next
        call to the lock store (see :meth:`release_soon`), and an answer that the lease
        was gone meanwhile (an operator freed it, the store lost its data) marks it
        ``lost``, as a renewal would, through the lease keeper.

            >>> from celery_redislock.engine.admission import SlotLimit, admit
            >>> import redis
            >>> client = redis.Redis.from_url(redis_url)
            >>> lease = admit(client, [SlotLimit("adopt-doc", 1, "doc:")], lease=5)
            >>> mine = Lease.adopt(client, lease.handover(), '{"pid": 7}')
            >>> mine.token == lease.token, mine.release()
            (True, True)
        """
        parts = [cls.adopt(client, part, description) for part in record["parts"]]
        if any(part is None for part in parts):
            return None
        lease = cls._adopted_record(client, record, description,
                                    [part for part in parts if part is not None])
        if not lease._keys:
            return lease
        adoption = [str(record["member"]), lease._member, milliseconds(lease.lease_seconds),
                    *lease._costs]
        channel = (channel_for(client) if answer_later and handed_young(record) and not parts
                   else None)
        if channel is not None and client.connection_pool in _adopts_known:
            try:
                channel.send((*ADOPT.evalsha(client), len(lease._keys), *lease._keys,
                              *adoption), then=functools.partial(lease._adopted, adoption))
            except RedisError as exc:
                # Not written (an earlier request found the connection a restart of the
                # store broke): no answer comes, so it is handled here as an error
                # answer: adopted again now, else by the renewals.
                lease._adopted(adoption, [exc])
            return None if lease.lost else lease
        lease_end = int(ADOPT.run(client, lease._keys, adoption))
        if lease_end == 0:
            return None
        if channel is not None:
            _adopts_known.add(client.connection_pool)  # the server has the script now
        lease.expires_at_ms = lease_end
        return lease

    @classmethod
    def of_handover(cls, client: Any, record: Mapping[str, Any]) -> Lease:
        """The lease of :meth:`handover`'s ``record`` as it stands, with no request to the
        lock store: for the process that took it, to give it back unused.

            >>> from celery_redislock.engine.admission import SlotLimit, admit
            >>> import redis
            >>> client = redis.Redis.from_url(redis_url)
            >>> lease = admit(client, [SlotLimit("handover-doc", 1, "doc:")], lease=5)
            >>> Lease.of_handover(client, lease.handover()).release()
            True
        """
        return cls(name=str(record["name"]), fence=int(record["fence"]),
                   lease_seconds=float(record["lease"]), acquired_at_ms=int(record["at"]),
                   expires_at_ms=int(record["end"]), _client=client,
                   _keys=list(record["keys"]), _member=str(record["member"]),
                   _contended=bool(record["contended"]),
                   _took_last_slot=bool(record["last"]), _reserve_ms=int(record["reserve"]),
                   _parts=[cls.of_handover(client, part) for part in record["parts"]],
                   _epoch=int(record.get("epoch") or 0),
                   _costs=[int(cost) for cost in record.get("costs") or ()])

    @classmethod
    def _adopted_record(cls, client: Any, record: Mapping[str, Any], description: str,
                        parts: List[Lease]) -> Lease:
        """The lease of :meth:`handover`'s ``record``, under ``description``."""
        lease = cls.of_handover(client, {**record, "parts": []})
        token, acquired, fence = lease._member.split(" ", 3)[:3]
        lease._member = holder_member(token, int(acquired), int(fence), description)
        lease._parts = parts
        return lease

    def _adopted(self, adoption: List[Any], replies: List[Any]) -> None:
        """The answer to an adoption sent without waiting (see :meth:`adopt`). An error
        in its place (the script unknown to a restarted server, a connection the restart
        broke, the store unreachable) leaves the lease held as it was admitted: it is
        adopted again now, on a new connection, or else by the lease keeper's renewals,
        which renew it meanwhile; only a lease found gone is lost (issue 27: it was
        marked lost at once, and the body ran on a lease nobody renewed)."""
        reply = replies[0]
        if isinstance(reply, RedisError):
            _adopts_known.discard(getattr(self._client, "connection_pool", None))
            self._adoption = adoption
            self._adopt_again()
            return
        if int(reply) == 0:
            self.lost = True
            lease_keeper().report_lost(self, "the lease had ended before it was adopted")
        else:
            self.expires_at_ms = int(reply)

    def _adopt_again(self) -> None:
        """:meth:`_finish_adoption` now, a second time on a new connection if the first
        met one that a restart of the lock store broke; left to the lease keeper's
        renewals if the store does not answer."""
        for attempt in (1, 2):
            try:
                adopted = self._finish_adoption()
            except RedisError as exc:
                if attempt == 2 or not is_transient(exc):
                    logger.warning("celery-redislock: holder %s could not adopt its lease on "
                                   "%r yet (%s); its renewals will", self.token, self.name,
                                   describe_error(exc))
                    return
                continue
            if not adopted:
                lease_keeper().report_lost(self, "the lease had ended before it was adopted")
                return
            logger.info("celery-redislock: holder %s adopted its lease on %r again (its first "
                        "answer was an error)", self.token, self.name)
            if self._given_back:  # released before this answer came
                for index, key in enumerate(self._keys):
                    self._client.zrem(key, *self._members(index))
            return

    def _finish_adoption(self) -> bool:
        """Adopt the lease (one script, as :meth:`adopt` does), renewing it; False (and
        ``lost``) if it is gone. If the holder admitted is gone, the adoption may have
        been applied with its answer lost: this process's own member is renewed instead
        (or re-asserted, after a loss of the store's data)."""
        adoption, self._adoption = self._adoption, []
        try:
            lease_end = int(ADOPT.run(self._client, self._keys, adoption))
        except RedisError:
            self._adoption = adoption
            raise
        if lease_end:
            self.expires_at_ms = lease_end
            return True
        renewed = self._renew_member()
        self.lost = self.lost or not renewed
        return renewed

    def release(self, wait: bool = True) -> bool:
        """Give the slots back; False if they were no longer held (released already, or
        the lease ran out and someone was admitted since). Safe to call twice.

        A freed slot goes to the semaphore's parked line, if it has one and this lease
        was taken by a caller that can move parked runs: the moves owed are added to
        :attr:`handoffs`. ``wait`` is kept for compatibility:
        this always waits for the answer (see :meth:`release_soon` for a release that
        does not). One round trip; two for the first holders of a key that became
        contended while they ran.
        """
        if self._parts:
            results = [part.release(wait) for part in self._parts]
            for part in self._parts:
                self.handoffs.extend(part.handoffs)
                part.handoffs.clear()
            return all(results)
        if not self._keys:
            return False
        self._give_back()
        if len(self._keys) == 1 and not self._contended:
            return self._release_uncontended()
        held_ms = round((time.monotonic() - self._taken_at) * 1000)
        reply = RELEASE.run(self._client, self._keys,
                            [self._member, held_ms, self._reserve_ms, *self._costs])
        self.handoffs.extend(handoffs_of(reply[1:]))
        return bool(int(reply[0]))

    def release_unreserved(self) -> bool:
        """:meth:`release`, reserving no freed slot for a parked line: the slot is simply
        free, and the workers' poll hands it to the line (see ``due.lua``). For a process
        that may not live to move the parked run (being killed), whose reservation would
        otherwise keep the slot from everyone until it lapsed."""
        for lease in (self, *self._parts):
            lease._reserve_ms = 0
        return self.release()

    def release_soon(self, on_handoffs: Callable[[List[Any]], None], *,
                     with_next_request: bool = False) -> None:
        """Give the slots back without waiting for Redis's answer where the answer is
        seldom needed, else as :meth:`release` does.

        Nobody waited for the semaphore when this lease was taken, and it left free
        slots (the usual case): the release is sent, and this thread goes on; Redis
        applies it before anything the thread asks next. With ``with_next_request`` it
        is not even written yet: it goes out in the same write as the thread's next
        request to the lock store (usually its next run's admission), which saves a
        network exchange, or is written by the lease keeper's thread within about
        10 ms. Whoever learns of the run's end meanwhile (its result, a chained step)
        and finds the semaphore full parks, and that release serves its line. The
        answer, read at the thread's next call (or by the keeper), says whether the
        semaphore became contended meanwhile; only then is the slot handed over, and the
        moves owed go to ``on_handoffs``, maybe from the keeper's thread. Otherwise (a
        line, or the last free slot taken: the next run to ask waits for this release)
        the release waits for its answer and ``on_handoffs`` gets the moves at once. A
        release that fails after it was sent is logged; its slot comes back when its
        lease ends. Raises ``RedisError`` if it could not be sent::

            lease.release_soon(lambda moves: handoff.publish(app, moves))
        """
        self._give_back()
        channel = channel_for(self._client) if self._keys else None
        if (channel is None or len(self._keys) != 1 or self._contended
                or self._took_last_slot):
            self.release_handing_over(on_handoffs)
            return
        key = self._keys[0]
        channel.send(("ZREM", key, *self._members(0)), ("ZSCORE", key, CONTENDED),
                     then=functools.partial(self._released_soon, on_handoffs),
                     now=not with_next_request)

    def _give_back(self) -> None:
        """Mark the lease given back; one whose adoption was not done (see
        :meth:`_adopted`) gives back the holder that was admitted."""
        self._given_back = True
        if self._adoption:
            self._member, self._adoption = str(self._adoption[0]), []

    def release_handing_over(self, on_handoffs: Callable[[List[Any]], None]) -> bool:
        """:meth:`release`, then pass the moves owed to parked lines handed the freed
        slots to ``on_handoffs`` (if any) rather than keeping them in :attr:`handoffs`."""
        released = self.release()
        handed, self.handoffs[:] = list(self.handoffs), []
        if handed:
            on_handoffs(handed)
        return released

    def _released_soon(self, on_handoffs: Callable[[List[Any]], None],
                       replies: List[Any]) -> None:
        """The answer to :meth:`release_soon`'s request: hand the slot over if a line
        formed while this lease was held."""
        failure = next((reply for reply in replies if isinstance(reply, RedisError)), None)
        try:
            if failure is not None:
                raise failure
            moves = self._wake_line_formed_meanwhile(*replies)
            if moves:
                on_handoffs(moves)
        except RedisError as exc:
            logger.warning(
                "celery-redislock: the release of %r by holder %s failed (%s); its slot "
                "comes back when its lease ends, within %.0f s",
                self.name, self.token, describe_error(exc), self.lease_seconds,
            )

    def _release_uncontended(self) -> bool:
        """Nobody waited when the slot was taken: remove the entry with a plain ``ZREM``,
        and look, in the same round trip, whether the semaphore became contended since
        (a run was refused or parked: its member ``#hold``). Only then (the first
        holders of a busy spell) does a second call hand the slot over to its parked
        line. A run that asks after the look finds the slot free itself."""
        key = self._keys[0]
        commands = (("ZREM", key, *self._members(0)), ("ZSCORE", key, CONTENDED))
        channel = channel_for(self._client)
        if channel is not None:
            removed, has_line = channel.call_many(*commands)
        else:
            pipe = self._client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            removed, has_line = pipe.execute()
        self.handoffs.extend(self._wake_line_formed_meanwhile(removed, has_line))
        return bool(removed)

    def _wake_line_formed_meanwhile(self, removed: Any, contended: Any) -> List[Any]:
        """After an uncontended release (``ZREM``, and ``ZSCORE`` of the mark of a
        contended semaphore): if it freed the slot and the semaphore became contended
        while the lease was held (a line may have formed), hand the free slots to its
        parked line; the moves owed."""
        wake = self.wake_after(removed, contended)
        return [] if wake is None else handoffs_of(WAKE.run(self._client, *wake))

    def release_commands(self) -> Optional[List[Tuple[Any, ...]]]:
        """The commands of an uncontended release (see :meth:`release_soon`), for a
        caller that sends them itself and hands their replies to :meth:`wake_after`;
        None for a lease to release with :meth:`release_handing_over` (a line, the last
        slot taken, several keys or parts, no slots)."""
        if self._parts or len(self._keys) != 1 or self._contended or self._took_last_slot:
            return None
        self._give_back()
        key = self._keys[0]
        return [("ZREM", key, *self._members(0)), ("ZSCORE", key, CONTENDED)]

    def wake_after(self, removed: Any, contended: Any) -> Optional[Tuple[List[str], List[Any]]]:
        """The keys and arguments of ``wake.lua`` (:data:`~.scripts.WAKE`) to run after
        an uncontended release answered ``removed`` and ``contended``: it freed the slot
        and a line may have formed meanwhile; None: nothing to hand over."""
        return wake_of(self._keys[0], self._reserve_ms, removed, contended)


def wake_of(key: str, reserve_ms: int, removed: Any, contended: Any
            ) -> Optional[Tuple[List[str], List[Any]]]:
    """:meth:`Lease.wake_after` of a lease of ``key`` that reserves ``reserve_ms`` for a
    hand-off: ``wake.lua``'s keys and arguments, or None.

        >>> wake_of("k", 10_000, 1, b"1"), wake_of("k", 10_000, 0, b"1"), wake_of("k", 0, 1, b"1")
        ((['k'], [10000]), None, None)
    """
    if removed and contended is not None and reserve_ms > 0:
        return [key], [reserve_ms]
    return None


@dataclass(frozen=True)
class ParkRef:
    """Where a parked run waits: the semaphore ``key`` whose parking queue holds its one
    message, under ``park_id`` (``"<incarnation>:<n>"``; a copy whose park id its
    reference no longer names is stale). See :mod:`.parking`.

        >>> ParkRef("redislock:{ab}:s:reports", "1700000000000000:7").park_id
        '1700000000000000:7'
    """

    key: str
    park_id: str
    #: The sub-line it waits in (a fair line's key of the run, see :mod:`.fair`; "" none).
    sub: str = ""


@dataclass(frozen=True)
class ParkedMove:
    """A hand-off owed to a parked line: one slot of semaphore ``key`` is reserved for
    it, and whoever got this entry (in a lease's ``handoffs``, or from
    :func:`.parking.due`) moves one message out of ``key``'s parking queue back to the
    queue its task is consumed from (or calls :func:`.parking.moved_nothing` if the
    parking queue is empty).

        >>> handoffs_of([b"!move 2 redislock:{ab}:s:reports"]) == [
        ...     ParkedMove("redislock:{ab}:s:reports")] * 2
        True
        >>> handoffs_of([b"!move 1 redislock:{ab}:s:reports\x1ftenant:a"])
        [ParkedMove(key='redislock:{ab}:s:reports', sub='tenant:a')]
    """

    key: str
    #: The sub-line to move from (a fair line's, see :mod:`.fair`; "" for the key's own).
    sub: str = ""


#: How a script reports moves owed to a parked line.
_MOVE_MARK = "!move "

#: Between a key and its sub-line in a move entry (``"!move 1 <key>\x1f<sub>"``).
SUB_MARK = "\x1f"


def handoffs_of(entries: Sequence[Any]) -> List[Any]:
    """The hand-offs of a script's reply: for each ``"!move <count> <key>"`` entry,
    ``count`` :class:`ParkedMove` entries; entries read already (a :class:`ParkedMove`)
    as they are."""
    handed: List[Any] = []
    for entry in entries:
        text = entry.decode("utf-8", "surrogateescape") if isinstance(entry, bytes) else entry
        if isinstance(text, str) and text.startswith(_MOVE_MARK):
            _, count, line = text.split(" ", 2)
            key, _, sub = line.partition(SUB_MARK)
            handed.extend(ParkedMove(key, sub) for _ in range(int(count)))
        else:
            handed.append(entry)
    return handed


@dataclass(frozen=True)
class Busy:
    """Refused by a concurrency limit: every slot of ``name`` was taken.

    ``retry_hint`` is the time (seconds) until the earliest current lease ends, which is
    when a crashed holder's slot would come back; ``average_hold`` is the recent average
    time holders kept a slot, or None before anyone released one.
    """

    name: str
    holders: int
    slots: int
    retry_hint: float
    average_hold: Optional[float]
    server_time_ms: int
    #: The key of the semaphore that refused the run.
    key: str = ""
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)
    #: The slots of ``name`` the run needs at once (its cost; see :class:`SlotLimit`).
    cost: int = 1
    #: On the parked line (:mod:`.parking`): the refusal wrote the run's reference; the
    #: caller publishes the copy to ``park.key``'s parking queue with ``park.park_id``,
    #: then acknowledges the original. None for a refusal by :func:`admit`.
    park: Optional[ParkRef] = None


@dataclass(frozen=True)
class Paused:
    """Refused because an operator paused limit ``name``
    (see :mod:`celery_redislock.admin.control`).

    ``retry_hint`` is the time (seconds) until the pause ends, or None for a pause
    without an end.
    """

    name: str
    key: str
    retry_hint: Optional[float]
    server_time_ms: int
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)
    #: The slots of ``name`` the run needs at once, for a paused semaphore (else 1).
    cost: int = 1


@dataclass(frozen=True)
class Served:
    """A stale copy of a parked run: its reference is served (another copy of its
    message ran, or runs, the task) or names another park id, so this one must not run.
    See :mod:`.parking`."""

    name: str
    server_time_ms: int
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)


@dataclass(frozen=True)
class RateLimited:
    """Refused by a rate limit: the run is promised a start ``wait`` seconds from now.

    Coming back with ``promise`` (pass it in ``promises``) keeps its place in the line.
    ``ahead`` is how many starts come before the promised one.
    """

    name: str
    key: str
    promise: int
    wait: float
    server_time_ms: int
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)
    ahead: int = 0


@dataclass(frozen=True)
class Booked:
    """Admitted from a start ``wait`` seconds from now, booked for the run (see
    ``admit(..., book_ms=...)``): its one rate limiter ``key`` counts that start as
    taken. The caller holds the run until then and starts it under ``lease`` without
    asking again; a run it cannot start then gives the start back (:meth:`give_back`)
    and asks anew.

        >>> from celery_redislock.engine.rate import Rate
        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> limit = RateLimit("booked-doc", Rate.parse("10/s", burst=0), "doc:")
        >>> first = admit(client, [limit], lease=5)
        >>> second = admit(client, [limit], lease=5, book_ms=500)
        >>> type(second).__name__, 0 < second.wait <= 0.1
        ('Booked', True)
        >>> second.lease.acquired_at_ms >= first.acquired_at_ms + 100, second.give_back()
        (True, True)
    """

    lease: Lease
    key: str
    #: The rate's interval for this run (µs; its cost's starts): what :meth:`give_back`
    #: gives back.
    interval_us: float
    wait: float
    server_time_ms: int
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)
    #: The rate limiter's count (its GCRA ``tat``, µs) as the booking left it.
    counted_until_us: int = 0
    #: The run's cost in starts (a rate set at run time counts it in its own interval).
    cost: int = 1

    def give_back(self) -> bool:
        """Give the booked start back (the run did not start on time); True if it was
        given back: only while no later start was counted (else taking it out of the
        count could let a later start come too close to one counted after it; it is
        left unused). One script."""
        return bool(REFUND.run(self.lease._client, [self.key],
                               [repr(self.interval_us), self.counted_until_us,
                                self.cost]))


@dataclass(frozen=True)
class WouldAdmit:
    """The answer to a probe (``admit(..., probe=True)``): every limiter would admit the
    run now, and nothing was taken. The run must still ask to be admitted."""

    server_time_ms: int
    handoffs: List[Any] = field(default_factory=list, repr=False, compare=False)


#: What :func:`admit` answers (:class:`WouldAdmit` only to a probe, :class:`Booked` only
#: with ``book_ms``).
Outcome = Union[Lease, Busy, RateLimited, Paused, Served, WouldAdmit, Booked]


def admit(
    client: Any,
    limiters: Sequence[Limiter],
    *,
    lease: float,
    description: str = "",
    promises: Optional[Mapping[str, int]] = None,
    owner: str = "",
    reserve_ms: int = 0,
    probe: bool = False,
    book_ms: int = 0,
) -> Outcome:
    """Try once to pass every limiter: a :class:`Lease`, or why not (:class:`Busy`,
    :class:`RateLimited`, :class:`Paused`).

    ``probe``: take nothing if every limiter would admit the run, and answer
    :class:`WouldAdmit`; a refusal is the same as without it (a rate limiter's promise
    is made). For a caller that cannot hold a slot yet, but can act on a refusal.

    ``book_ms``: a run whose only limiter is a rate limiter, that would be promised a
    start within that many milliseconds, is admitted from that start (:class:`Booked`),
    for a caller that can hold the run until then and start it on time; one call instead
    of a promise and a second admission.

    ``promises`` maps a rate limiter's Redis key to the start time (µs) it promised this
    run earlier. ``owner`` starts the holder token (see :func:`owner_prefix`).
    ``reserve_ms`` > 0 says the caller moves parked runs out of their parking queues:
    the lease's release hands the slots it frees to their parked lines (the moves owed
    come back in its ``handoffs``, see :mod:`.parking`). On Redis Cluster, limiters in different
    hash slots are admitted slot by slot, and a refusal gives back what the earlier
    slots took.
    """
    promises = promises or {}
    token = owner + new_token()
    if len(limiters) > 1 and is_cluster(client):
        groups = _groups(client, limiters)
        if len(groups) > 1:
            return _admit_across_slots(client, groups, token, lease, description, promises,
                                       reserve_ms, probe)
    return _admit_group(client, limiters, token, lease, description, promises, reserve_ms,
                        probe, book_ms)


def _groups(client: Any, limiters: Sequence[Limiter]) -> List[List[Limiter]]:
    """The limiters in groups of one Cluster hash slot each: those without a rate limit
    first, so that a rate is spent only once the slots are taken."""
    by_key = {limiter.key: limiter for limiter in limiters}
    groups = [[by_key[key] for key in keys]
              for keys in by_hash_slot(client, [limiter.key for limiter in limiters])]
    return sorted(groups, key=lambda group: any(isinstance(x, RateLimit) for x in group))


def _admit_across_slots(client: Any, groups: List[List[Limiter]], token: str, lease: float,
                        description: str, promises: Mapping[str, int], reserve_ms: int,
                        probe: bool = False) -> Outcome:
    """Admit group by group; on a refusal, give back what the earlier groups took. A
    probe asks every group, and takes nothing."""
    taken: List[Tuple[List[Limiter], Lease]] = []
    handoffs: List[Any] = []
    for group in groups:
        outcome = _admit_group(client, group, token, lease, description, promises,
                               reserve_ms, probe)
        if isinstance(outcome, WouldAdmit):
            handoffs.extend(outcome.handoffs)
            continue
        if not isinstance(outcome, Lease):
            outcome.handoffs.extend(handoffs)
            for earlier_group, earlier in taken:
                earlier.release()
                outcome.handoffs.extend(earlier.handoffs)
                for limiter in earlier_group:
                    if isinstance(limiter, RateLimit):
                        REFUND.run(client, [limiter.key],
                                   [repr(limiter.start_us), "", limiter.cost])
            return outcome
        taken.append((group, outcome))
    if probe:
        return WouldAdmit(server_time_ms=0, handoffs=handoffs)
    parts = [part for _, part in taken]
    return Lease(
        name=", ".join(part.name for part in parts if part.name),
        fence=max(part.fence for part in parts),
        lease_seconds=lease,
        acquired_at_ms=min(part.acquired_at_ms for part in parts),
        expires_at_ms=min(part.expires_at_ms for part in parts),
        _client=client,
        _parts=parts,
        handoffs=[message for part in parts for message in part.handoffs],
    )


def _admit_group(client: Any, limiters: Sequence[Limiter], token: str, lease: float,
                 description: str, promises: Mapping[str, int], reserve_ms: int,
                 probe: bool = False, book_ms: int = 0) -> Outcome:
    """One admit.lua call for limiters that share a Redis node and hash slot."""
    call = AdmitCall.of(client, limiters, token, lease, description, promises, reserve_ms,
                        probe, book_ms)
    return call.outcome(call.script.run(client, call.keys, call.args))


def script_for(limiters: Sequence[Limiter]) -> Any:
    """The admission script for ``limiters``, by mode: semaphores only, rate limiters
    only, or both kinds at once (one admission; each script is the same without the
    other kind's code).

        >>> script_for([SlotLimit("a", 1, "doc:")]).name
        'admit_slots.lua'
        >>> script_for([RateLimit("b", Rate(5, 1.0), "doc:")]).name
        'admit_rate.lua'
        >>> script_for([SlotLimit("a", 1, "doc:"), RateLimit("b", Rate(5, 1.0), "doc:")]).name
        'admit.lua'
    """
    rates = sum(1 for limiter in limiters if isinstance(limiter, RateLimit))
    if rates == 0:
        return ADMIT_SLOTS
    return ADMIT_RATE if rates == len(limiters) else ADMIT


@dataclass(frozen=True)
class AdmitCall:
    """One admit.lua call, as keys and arguments, and what its reply means: for
    :func:`admit`, and for a caller that sends the script itself and gets the reply later
    (the worker's main process, see :func:`prepare_admit`)."""

    client: Any
    limiters: Sequence[Limiter]
    token: str
    lease: float
    description: str
    reserve_ms: int
    keys: List[str]
    args: List[Any]

    @property
    def script(self) -> Any:
        """The script to send: :data:`~.scripts.ADMIT_SLOTS` for semaphores only,
        :data:`~.scripts.ADMIT_RATE` for rate limiters only, else :data:`~.scripts.ADMIT`
        (the same admission, by mode)."""
        return script_for(self.limiters)

    @classmethod
    def of(cls, client: Any, limiters: Sequence[Limiter], token: str, lease: float,
           description: str, promises: Mapping[str, int], reserve_ms: int,
           probe: bool = False, book_ms: int = 0) -> AdmitCall:
        bound = grace_bound_ms(client, lease)
        args = [token, milliseconds(lease), description,
                *(limiter.spec(promises) for limiter in limiters),
                -1 if is_cluster(client) else seen_incarnation(client),
                *(("1" if probe else "0", book_ms, bound)
                  if probe or book_ms or bound > milliseconds(lease) else ())]
        return cls(client, limiters, token, lease, description, reserve_ms,
                   [limiter.key for limiter in limiters], args)

    def outcome(self, reply: Any) -> Outcome:
        """The outcome that admit.lua's ``reply`` stands for."""
        client, limiters, token, lease = self.client, self.limiters, self.token, self.lease
        description, reserve_ms = self.description, self.reserve_ms
        if not isinstance(reply, list):  # admitted: "now_ms lease_end_ms fence contended last"
            now_ms, lease_end, fence, contended, last = map(int, reply.split())
            saw_incarnation(client, fence)
            return _lease(client, limiters, token, lease, description, reserve_ms,
                          now_ms, lease_end, fence, contended, last, [])
        status, now_ms, index = int(reply[0]), int(reply[1]), int(reply[2])
        a, b, c, d = reply[3:7]
        if status == 5:
            return WouldAdmit(server_time_ms=now_ms)
        if status == 6:
            start_ms = int(a) // 1000
            return _booked(limiters[index - 1], _lease(
                client, limiters, token, lease, description, reserve_ms, start_ms,
                start_ms + milliseconds(lease), 0, 0, 0, []), int(b), int(c), now_ms, [])
        return _refusal(limiters[index - 1], status, now_ms, (a, b, c, d))


def prepare_admit(
    client: Any,
    limiters: Sequence[Limiter],
    *,
    lease: float,
    description: str = "",
    promises: Optional[Mapping[str, int]] = None,
    owner: str = "",
    reserve_ms: int = 0,
    probe: bool = False,
    book_ms: int = 0,
) -> Optional[AdmitCall]:
    """:func:`admit` as one script call for the caller to send (``EVALSHA`` of
    :data:`~.scripts.ADMIT` with ``call.keys`` and ``call.args``) and its reply to read
    (``call.outcome(reply)``); None when it takes more than one call (limiters in several
    Redis Cluster hash slots): the caller calls :func:`admit` instead."""
    if len(limiters) > 1 and is_cluster(client) and len(_groups(client, limiters)) > 1:
        return None
    return AdmitCall.of(client, limiters, owner + new_token(), lease, description,
                        promises or {}, reserve_ms, probe, book_ms)


def _booked(limiter: Limiter, lease: Lease, wait_ms: int, counted_until_us: int,
            now_ms: int, handoffs: List[Any]) -> Booked:
    """admit.lua's answer that ``limiter`` booked the run a start, ``wait_ms`` from now,
    with the lease (from that start) it runs under."""
    assert isinstance(limiter, RateLimit)
    return Booked(lease=lease, key=limiter.key,
                  interval_us=limiter.start_us,
                  wait=max(0, wait_ms) / 1000.0, server_time_ms=now_ms, handoffs=handoffs,
                  counted_until_us=counted_until_us, cost=limiter.cost)


def _refusal(limiter: Limiter, status: int, now_ms: int, fields: Sequence[Any]) -> Outcome:
    """admit.lua's refusal by ``limiter`` (``status`` and the four ``fields`` of its
    reply, see the script) as an outcome."""
    a, b, c, d = fields
    if status == 0:
        assert isinstance(limiter, SlotLimit)
        return Busy(
            name=limiter.name,
            holders=int(a),
            slots=limiter.slots,
            retry_hint=max(0, int(b)) / 1000.0,
            average_hold=None if int(c) < 0 else int(c) / 1000.0,
            server_time_ms=now_ms,
            key=limiter.key,
            cost=limiter.cost,
        )
    if status == 3:
        return Paused(name=limiter.name, key=limiter.key,
                      retry_hint=None if int(a) < 0 else max(0, int(a) - now_ms) / 1000.0,
                      server_time_ms=now_ms,
                      cost=limiter.cost if isinstance(limiter, SlotLimit) else 1)
    return RateLimited(
        name=limiter.name,
        key=limiter.key,
        promise=int(a),
        wait=max(0, int(b)) / 1000.0,
        server_time_ms=now_ms,
        ahead=int(d),
    )


def _lease(client: Any, limiters: Sequence[Limiter], token: str, lease: float,
           description: str, reserve_ms: int, now_ms: int, lease_end: int, fence: int,
           contended: int, last: int, handoffs: List[Any]) -> Lease:
    semaphores = [limiter for limiter in limiters if isinstance(limiter, SlotLimit)]
    costs = [limiter.cost for limiter in semaphores]
    return Lease(
        name=", ".join(limiter.name for limiter in semaphores),
        fence=fence,
        lease_seconds=lease,
        acquired_at_ms=now_ms,
        expires_at_ms=lease_end,
        _client=client,
        _keys=[limiter.key for limiter in semaphores],
        _member=holder_member(token, now_ms, fence, description),
        _contended=bool(contended),
        _took_last_slot=bool(last),
        _reserve_ms=reserve_ms,
        handoffs=handoffs,
        _costs=costs if any(cost != 1 for cost in costs) else [],
    )


#: Connection pools whose server ran ``adopt.lua`` for this process: an adoption sent
#: without waiting finds the script there (see :meth:`Lease.adopt`).
_adopts_known: weakref.WeakSet[Any] = weakref.WeakSet()
os.register_at_fork(after_in_child=_adopts_known.clear)

#: Per client of a lock store: the latest incarnation of the store this process saw (the
#: incarnation's ``born``, or a fencing number granted in it, µs). An admission passes it,
#: so that a store found without an incarnation is known to have lost its data (see
#: ``store.lua``). Pool children inherit it through ``fork``.
_seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def seen_incarnation(client: Any) -> int:
    """The latest incarnation of the lock store behind ``client`` seen here, 0 if none."""
    try:
        return int(_seen.get(client, 0))
    except TypeError:  # a client that cannot be referred to weakly
        return 0


def saw_incarnation(client: Any, value: int) -> None:
    """Remember that the lock store behind ``client`` was seen in incarnation ``value``
    (its ``born``, or a fencing number granted in it), if later than what was seen.

        >>> class Client: ...
        >>> client = Client()
        >>> saw_incarnation(client, 5); saw_incarnation(client, 3); seen_incarnation(client)
        5
    """
    try:
        if value > _seen.get(client, 0):
            _seen[client] = value
    except TypeError:
        pass


#: Per client of a lock store: the longest lease (s) this process declared it may hold
#: there (see :func:`declare_longest_lease`).
_longest: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def declare_longest_lease(client: Any, seconds: float) -> None:
    """Declare that holders of this process (and of the processes of its deployment) may
    hold leases of up to ``seconds`` in the lock store behind ``client``: every
    admission and renewal carries it, so that after the store lost its data no slot is
    granted afresh until that long after the loss, whoever calls first (see
    ``store.lua``). A longer declaration replaces a shorter one.

        >>> class Client: ...
        >>> client = Client()
        >>> declare_longest_lease(client, 30); declare_longest_lease(client, 6)
        >>> grace_bound_ms(client, 5), grace_bound_ms(client, 60)
        (30000, 60000)
    """
    try:
        if seconds > _longest.get(client, 0.0):
            _longest[client] = float(seconds)
    except TypeError:  # a client that cannot be referred to weakly
        pass


def grace_bound_ms(client: Any, lease: float) -> int:
    """The grace after a loss of the store's data that a caller holding ``lease``
    declares (ms): the longest lease declared for ``client``, or ``lease`` if longer."""
    try:
        declared = _longest.get(client, 0.0)
    except TypeError:
        declared = 0.0
    return milliseconds(max(lease, declared))


def declare_fresh(client: Any, prefix: str = "redislock:") -> None:
    """Tell the lock store behind ``client`` that it was emptied on purpose (say, between
    two tests): a new incarnation without a grace, so that no process takes the empty
    store for one that lost its data. One script::

        client.flushdb()
        declare_fresh(client)
    """
    FRESH.run(client, [f"{prefix}incarnation"], [])


def new_token() -> str:
    """A token no other acquisition anywhere has: this process's random id and a counter."""
    return f"{_process_id}{next(_counter):x}"


def _new_process_id() -> None:
    global _process_id, _counter
    _process_id = os.urandom(8).hex() + "."
    _counter = itertools.count()


_process_id, _counter = "", itertools.count()
_new_process_id()
os.register_at_fork(after_in_child=_new_process_id)


#: What :func:`holder_lease_end` answers for a holder freed by its worker for a run that
#: died (see ``release_owner.lua``).
FREED_AS_LOST = -1


def holder_lease_end(client: Any, key: str, member: str) -> Tuple[int, int]:
    """The server's time (ms), and the end of the lease (ms) of the holder ``member`` of
    semaphore ``key``: 0 when it is gone (released, or its lease ran out),
    :data:`FREED_AS_LOST` when its worker freed it for a run that died. One read-only
    script.

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url)
        >>> holder_lease_end(client, "redislock:{0}:s:nothing", "t 1 2 {}")[1]
        0
    """
    now_ms, lease_end = FOLLOW.run(client, [key], [member])
    return int(now_ms), int(lease_end)


def owner_prefix(worker: str, task_id: str = "", start: str = "") -> str:
    """The start of the holder tokens of a worker's runs, or of one task's runs on it.

    Tokens of task runs are ``"<worker node>|<task id>|<start id>:<random>"``, the start
    id naming one start of the worker (see :mod:`celery_redislock.engine.workers`), so the
    worker's main process can free what a pool child that died held, and a restarted
    worker what its previous life held, never what a live worker of the same node name
    holds (see :mod:`celery_redislock.gate.recovery`). Without a start id the
    token is ``"<worker node>|<task id>|<random>"``::

        >>> owner_prefix("w1@host", "task-1", "5eed")
        'w1@host|task-1|5eed:'
        >>> owner_prefix("w1@host")
        'w1@host|'
    """
    worker = _token_safe(worker)
    if not task_id:
        return f"{worker}|"
    return f"{worker}|{_token_safe(task_id)}|" + (f"{_token_safe(start)}:" if start else "")


def _token_safe(text: str) -> str:
    return text.replace("|", "_").replace(" ", "_")


def milliseconds(seconds: float) -> int:
    """Seconds as whole milliseconds, at least 1."""
    return max(1, round(seconds * 1000))
