"""Standbys: the next run of a parked line moved ahead to a worker, held there with no
slot, and handed the slot of a run of the same key that ends in that worker in one call.

A slot handed over through the line costs a chain of process hops between one run's
end and the next run's start: the release, the mover's move in the broker, a worker
receiving the moved copy, its admission. A *standby* takes those hops ahead of time:

* :func:`ask_standby` owes one move out of a semaphore's parked line with no slot
  reserved for it (a fair line's: from the sub-line whose turn it is, as a release's
  move); the moved copy asks as any moved copy, with :func:`standby_call`'s mark
  ``"?"``: instead of parking again (no slot for it), it is *held as a standby* by the
  worker that received it, its reference claimed by the ask's token (a claim with no
  slot, lapsing after 30 s; nothing is published). The answer is a refusal whose park
  id :func:`is_standby` tells apart;
* when a run of the same key ends in that worker, the standby goes to the pool under
  that run's lease, as a slot handed on does (the store sees one holder throughout), and
  :data:`STANDBY_CLAIM`, sent without waiting, claims the standby's reference for that
  holder, renews that holder's lease (so that a chain of standbys, which passes one
  lease on from run to run, keeps it young) and owes the next standby
  (:func:`claim_standby`). Or, the lease too old to be
  handed on, the standby asks again with that run's holder member (:func:`standby_call`
  ``swap=``): in one script the holder is removed (its claim served, as a release), its
  slot reserved for the line and taken by the standby at once, and the next standby
  owed. Either way the store never sees the slot free, nor two holders for it: **the
  limit holds by construction**;
* a worker killed with a standby loses nothing: the copy is its worker's unacknowledged
  message, which the broker gives back; its reference is claimed by a token that holds
  no slot, so the copy given back asks as any moved copy (takes a reservation, parks
  again, or is held as a standby again). No other copy of the run exists.

Only for one semaphore of cost 1 with no rate and no max wait (the script's
``lua/standby.lua`` holds nothing otherwise).

    >>> is_standby("=1700000000000:7"), is_standby("1700000000000:7")
    (True, False)
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

from .admission import ParkedMove, SlotLimit, handoffs_of, milliseconds
from .parking import ParkAdmitCall
from .scripts import LINE, PARKED, LuaScript

#: admit_parked.lua with the standby's prelude (``lua/standby.lua``).
STANDBY_ADMIT = LuaScript.load("admit_parked.lua", after=[
    *LINE, "parked_admit.lua", "parked_rates.lua", "parked_args.lua", "standby_owe.lua",
    "standby.lua"])
#: One move owed with no slot reserved (``lua/standby_ask.lua``).
STANDBY_ASK = LuaScript.load("standby_ask.lua", after=[*PARKED, "standby_owe.lua"])
#: A standby's reference claimed by the holder whose slot it was handed without waiting
#: (``lua/standby_claim.lua``).
STANDBY_CLAIM = LuaScript.load("standby_claim.lua", after=[*PARKED, "standby_owe.lua"])

#: The mark of a standby's park id in the admission's answer.
STANDBY_MARK = "="

#: The arguments of one semaphore's admission, all optional ones sent (ARGV[1..16]).
_FULL_ARGS = 16


def is_standby(park_id: str) -> bool:
    """Whether a refusal's park id says the copy is held as a standby."""
    return park_id.startswith(STANDBY_MARK)


def may_stand_by(call: ParkAdmitCall) -> bool:
    """Whether the admission ``call`` may hold its copy as a standby: a moved copy
    (home 1) of one semaphore of cost 1, no rate, no max wait."""
    limiters = call.limiters
    return (len(limiters) == 1 and isinstance(limiters[0], SlotLimit)
            and limiters[0].cost == 1 and len(call.keys) == 2 and call.args[4] == 1
            and (len(call.args) < 14 or call.args[13] in ("", None)))


@dataclasses.dataclass(frozen=True)
class StandbyAdmitCall(ParkAdmitCall):
    """A :class:`~.parking.ParkAdmitCall` sent through :data:`STANDBY_ADMIT`."""

    @property
    def script(self) -> LuaScript:
        return STANDBY_ADMIT


def standby_call(call: ParkAdmitCall, swap: Optional[str] = None) -> ParkAdmitCall:
    """``call`` (see :func:`may_stand_by`) asking with the standby's mark: its copy may
    be held as a standby, and first (``swap``, a holder's member of the same key, a run
    that ended in this worker) that holder's slot goes to it."""
    args: List[Any] = list(call.args)
    defaults = ["", "", "", 1]  # sub-line, max wait, priority's aging, cost
    while len(args) < _FULL_ARGS:
        args.append(defaults[len(args) - 12])
    args.append("?" if swap is None else f"? {swap}")
    fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
    return StandbyAdmitCall(**{**fields, "args": args})


@dataclasses.dataclass(frozen=True)
class StandbyMove(ParkedMove):
    """A move owed for the next standby: no slot is reserved for it, so one that finds
    its parking queue empty gives none back (it would take another move's reservation:
    :func:`~.parking.moved_nothing` with ``reserved=False``).

        >>> standby_moves([b"!move 1 k\x1fa", "other"])
        [StandbyMove(key='k', sub='a'), 'other']
    """


def standby_moves(entries: Sequence[Any]) -> List[Any]:
    """The hand-offs of a standby script's reply (:data:`STANDBY_ASK`,
    :data:`STANDBY_CLAIM`): its moves as :class:`StandbyMove` entries."""
    return [StandbyMove(entry.key, entry.sub) if type(entry) is ParkedMove else entry
            for entry in handoffs_of(list(entries))]


def ask_standby(client: Any, key: str) -> List[Any]:
    """Owe one move out of ``key``'s parked line with no slot reserved (the moves owed:
    none or one :class:`StandbyMove`, for the caller's mover)."""
    return standby_moves(STANDBY_ASK.run(client, [key], []))


def claim_args(member: str, run: str, park_id: str, lease: Optional[float] = None
               ) -> List[Any]:
    """The arguments of :data:`STANDBY_CLAIM`: the standby of run ``run`` (its park id
    ``park_id``, as :func:`is_standby` read it, mark and all) runs under the slot of
    holder ``member``, whose lease is renewed for ``lease`` seconds from now (None: not
    renewed)."""
    plain = park_id[len(STANDBY_MARK):] if is_standby(park_id) else park_id
    return [member, run, plain, *(() if lease is None else (milliseconds(lease),))]


def claim_standby(client: Any, key: str, member: str, run: str, park_id: str,
                  lease: Optional[float] = None) -> Tuple[bool, List[Any]]:
    """Claim the standby's reference for holder ``member`` of ``key``, whose slot it was
    handed in its worker, and renew that holder's lease for ``lease`` seconds (blocking;
    the worker sends :data:`STANDBY_CLAIM` on its event loop without waiting): whether
    it was claimed, and the moves owed (the next standby)."""
    reply = STANDBY_CLAIM.run(client, [key], claim_args(member, run, park_id, lease))
    return bool(int(reply[0])), standby_moves(reply[1:])
