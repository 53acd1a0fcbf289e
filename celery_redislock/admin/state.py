"""What one limit name looks like in Redis right now: holders, reservations, its parked
line, its number of slots, and whether an operator paused it. Read only, in batches.

Every time is on the Redis server's clock (``TIME``), the clock the leases are written in.

    >>> from celery_redislock.engine.keys import semaphore_key
    >>> states = read_states(client, [semaphore_key("crawl")], now_ms)  # doctest: +SKIP
    >>> states[0].used, states[0].limit, states[0].waiting, states[0].paused  # doctest: +SKIP
    (2, 2, 5, False)
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..engine.holder import Holder, parse_holder, text, unit_of
from ..engine.keys import RATE, RATE_CONTROL, SEMAPHORE_CONTROL, companion_key
from ..engine.parked_view import READS_PER_KEY, ParkedLine, add_reads, line_of
from ..engine.scan import split_key

#: A member of a semaphore that is a reservation for its parked line: ``"~~<n>"``
#: (``parking.lua``); :class:`Reservation` names it without its first ``~``.
RESERVED = "~"

#: The text of ``paused_until`` for a pause without an end.
FOREVER = "forever"


@dataclass(frozen=True)
class Reservation:
    """Slots kept for a run moved out of parking while its message travels to a worker:
    one, or the run's cost. ``ticket`` names the reservation (its member without the
    first ``~``: ``"~<n>"``, see :func:`~.parked_text.reservation_for`)."""

    ticket: str
    until_ms: int
    cost: int = 1


@dataclass(frozen=True)
class LimitState:
    """The state of limit ``name`` (semaphore ``key``) at ``server_time_ms``.

    ``holders`` are every holder entry, oldest first, with leases that ran out but are
    still stored (see :meth:`live_holders`).
    """

    name: str
    key: str
    server_time_ms: int
    exists: bool = False
    holders: List[Holder] = field(default_factory=list)
    reservations: List[Reservation] = field(default_factory=list)
    #: The slot count the last admission was configured with ('#slots'), if recorded.
    configured_slots: Optional[int] = None
    #: The operator's override ('slots' of the control hash), if any.
    slots_override: Optional[int] = None
    contended: bool = False
    paused: bool = False
    #: End of the pause (ms, server clock); None while not paused or paused for ever.
    paused_until_ms: Optional[int] = None
    #: True when the name has a rate limiter's state in Redis (it limits starts now).
    rate_limiter: bool = False
    #: The rate set at run time ('rate' of the rate limiter's control hash), if any.
    rate_override: Optional[str] = None
    #: The interval (µs) the rate limiter's state was last counted in ('iv'), if any.
    rate_interval_us: Optional[float] = None
    #: Its parked line: counts only; None without one.
    parked: Optional[ParkedLine] = None
    #: How many messages its parking queue holds in the broker; None when the broker
    #: was not asked (no connection, or no parked line).
    parked_messages: Optional[int] = None

    @property
    def waiting(self) -> int:
        """Runs waiting in its parked line: references and anonymous entries."""
        return self.parked.waiting if self.parked is not None else 0

    @property
    def live_holders(self) -> List[Holder]:
        """Holders whose lease has not ended."""
        return [h for h in self.holders if h.lease_end_ms > self.server_time_ms]

    @property
    def used(self) -> int:
        """Slots taken: live holders and live reservations, each its cost (a weighted run
        takes several)."""
        return (sum(holder.cost for holder in self.live_holders)
                + sum(reservation.cost for reservation in self.reservations))

    @property
    def limit(self) -> Optional[int]:
        """The slots admission allows now: the override, else the configured count."""
        return self.slots_override if self.slots_override is not None else self.configured_slots

    @property
    def tasks(self) -> Set[str]:
        """The tasks of the live holders (what uses the name now)."""
        return {h.task for h in self.live_holders if h.task}

    @property
    def pause_left(self) -> Optional[float]:
        """Seconds until the pause ends; None while not paused or paused for ever."""
        if self.paused_until_ms is None:
            return None
        return (self.paused_until_ms - self.server_time_ms) / 1000

    @property
    def active(self) -> bool:
        """True if anything is going on: holders, waiting runs, an override or a pause."""
        return bool(self.used or self.waiting or self.slots_override is not None
                    or self.paused or self.rate_override is not None)


def pause_text(state: LimitState) -> str:
    """A pause for people: ``no``, ``forever``, or its end on the Redis server's clock (UTC)
    and how far off it is.

        >>> pause_text(LimitState("n", "k", 1_700_000_000_000, paused=True,
        ...                       paused_until_ms=1_700_000_012_400))
        'until 22:13:32Z, in 12 s'
        >>> pause_text(LimitState("n", "k", 1_700_000_000_000, paused=True,
        ...                       paused_until_ms=1_800_000_000_000))
        'until 2027-01-15 08:00Z, in 1157 d'
    """
    if not state.paused:
        return "no"
    if state.paused_until_ms is None:
        return "forever"
    end = datetime.datetime.fromtimestamp(state.paused_until_ms / 1000, datetime.timezone.utc)
    left = max(0.0, (state.paused_until_ms - state.server_time_ms) / 1000)
    when = end.strftime("%H:%M:%SZ") if left < 86400 else end.strftime("%Y-%m-%d %H:%MZ")
    return f"until {when}, in {span(left)}"


def pause_short(state: LimitState) -> str:
    """A pause in a table cell: ``no``, ``forever``, or the time left.

        >>> pause_short(LimitState("n", "k", 0, paused=True, paused_until_ms=150_000))
        '2.5 min'
    """
    if not state.paused:
        return "no"
    left = state.pause_left
    return FOREVER if left is None else span(max(0.0, left))


def span(seconds: float) -> str:
    """A length of time in one unit people read at a glance.

        >>> span(12.4), span(150), span(7200), span(100_519_815)
        ('12 s', '2.5 min', '2 h', '1163 d')
    """
    if seconds < 100:
        return f"{round(seconds)} s"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size or unit == "min":
            value = seconds / size
            return f"{value:.2g} {unit}" if value < 10 else f"{round(value)} {unit}"
    raise AssertionError("unreachable")


def pause_of(value: Any, now_ms: int) -> Tuple[bool, Optional[int]]:
    """Read a ``paused_until`` field: ``(paused, end_ms)``; end None for ever.

        >>> pause_of(b"forever", 5), pause_of("9000", 5000), pause_of("4000", 5000)
        ((True, None), (True, 9000), (False, None))
    """
    if value is None:
        return False, None
    value = text(value)
    if value == FOREVER:
        return True, None
    try:
        end = int(float(value))
    except ValueError:
        return False, None
    return (True, end) if end > now_ms else (False, None)


def _merge_pauses(*pauses: Tuple[bool, Optional[int]]) -> Tuple[bool, Optional[int]]:
    """One pause from several: paused if any is; the latest end, for ever beating all."""
    active = [end for paused, end in pauses if paused]
    if not active:
        return False, None
    if any(end is None for end in active):
        return True, None
    return True, max(end for end in active if end is not None)


def _float(value: Any) -> Optional[float]:
    try:
        return float(text(value))
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> Optional[int]:
    try:
        return int(text(value))
    except (TypeError, ValueError):
        return None


def read_states(client: Any, keys: Sequence[str], now_ms: int, *,
                prefix: str = "") -> List[LimitState]:
    """The state of each semaphore key of ``keys``, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zrange(key, 0, -1, withscores=True)
        pipe.hmget(companion_key(key, SEMAPHORE_CONTROL), ["slots", "paused_until"])
        pipe.hmget(companion_key(key, RATE_CONTROL), ["paused_until", "rate"])
        pipe.hmget(companion_key(key, RATE), ["iv", "tat", "line"])
        add_reads(pipe, key, now_ms)
    replies = pipe.execute()
    step = 4 + READS_PER_KEY
    states: List[LimitState] = []
    for index, key in enumerate(keys):
        replied = replies[step * index: step * index + step]
        entries, control, rate_control, rate = replied[:4]
        state = _state(key, prefix, now_ms, entries, control, rate_control)
        if any(value is not None for value in rate):
            state = replace(state, rate_limiter=True, rate_interval_us=_float(rate[0]))
        parked = line_of(key, replied[4:step], now_ms)
        if parked is not None:
            state = replace(state, parked=parked,
                            contended=state.contended or parked.waiting > 0)
        states.append(state)
    return states


def _entries(entries: List[Tuple[Any, float]], now_ms: int
             ) -> Tuple[List[Holder], List[Reservation], Dict[str, float]]:
    """A semaphore's members as holders, live reservations and statistics; the units of
    weighted holders and reservations (``units.lua``) counted in their ``cost``."""
    holders: List[Holder] = []
    reservations: List[Reservation] = []
    statistics: Dict[str, float] = {}
    units: Counter = Counter()  # further slots of weighted holders and reservations
    for member, score in entries:
        member = text(member)
        if score < 0:
            statistics[member] = score
        elif unit_of(member) is not None:
            if score > now_ms or not member.startswith(RESERVED):
                units[unit_of(member)] += 1
        elif member.startswith(RESERVED):
            if score > now_ms:
                reservations.append(Reservation(member[len(RESERVED):], int(score)))
        elif not member.startswith("#"):
            holders.append(parse_holder(member, score))
    holders = [replace(h, cost=1 + units[h.token]) if units[h.token] else h for h in holders]
    reservations = [replace(r, cost=1 + units[RESERVED + r.ticket])
                    if units[RESERVED + r.ticket] else r for r in reservations]
    return holders, reservations, statistics


def _state(key: str, prefix: str, now_ms: int, entries: List[Tuple[Any, float]],
           control: List[Any], rate_control: List[Any]) -> LimitState:
    holders, reservations, statistics = _entries(entries, now_ms)
    holders.sort(key=lambda holder: (holder.acquired_ms, holder.token))
    slots = statistics.get("#slots")
    paused, until = _merge_pauses(pause_of(control[1], now_ms),
                                  pause_of(rate_control[0], now_ms))
    split = split_key(key, prefix)
    return LimitState(
        name=split[1] if split else key,
        key=key,
        server_time_ms=now_ms,
        exists=bool(entries),
        holders=holders,
        reservations=reservations,
        configured_slots=None if slots is None else int(-slots),
        slots_override=_int(control[0]) if control[0] is not None else None,
        contended="#hold" in statistics,
        paused=paused,
        paused_until_ms=until,
        rate_override=None if rate_control[1] is None else text(rate_control[1]),
    )
