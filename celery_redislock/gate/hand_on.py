"""A slot handed on in the worker's main process, from a run that ended to the next run
of the same key waiting there for a pool process, with no request to the lock store.

With admission before the pool, the worker's main process gives back the slot of an
uncontended run when the pool reports its end (see :mod:`.gate`). If the next run
waiting in the same worker for a pool process is a run of the same task, whose limits
are slots only under constant keys (so it would ask for exactly those slots), the slot
is not given back and asked for again: the waiting run goes to the pool under the same
lease, as if the ended run's holding had gone on. The lock store sees one holder all
along, so **the limit holds by construction**: the slot stays counted in the store under
its lease, renewed by the pool process that runs under it should that run last a third
of a lease, and a worker killed loses it when its lease ends, as any slot.

Bounded so that runs waiting elsewhere (parked, or in other workers) are never passed
for long: a slot is handed on at most :data:`HAND_ON_RUNS` times in a row, and only
while its lease is younger than :data:`HAND_ON_AGE` (and a sixth of a lease); then it
goes back to the store, whose release hands it to a line that formed meanwhile, and the
next run asks. A lease that was contended when taken (a line, the last free slot) is
never handed on: its release goes to the store at once.

When no run of those limits waits there as a run ends, the slot is kept for the next run
of them the worker gates within :data:`~.kept_leases.SPARE_FOR` (5 ms, as long as its release
would wait for an ask to go with), under the same bounds, then given back
(:mod:`.kept_leases`).

A run handed a slot holds it under the token of the run its slot was first taken for;
the worker's recovery frees that token when the run's pool process is lost
(:func:`token_of`).

    >>> record = {"member": "w1|t1|s:ab 1 2 {}", "lease": 60.0, "taken": 0.0}
    >>> handed_on(record)[HANDED_ON], token_of("t2") is None
    (1, True)
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..config.limit import TaskLimits

#: How many runs in a row one slot taken from the lock store may be handed on to.
HAND_ON_RUNS = 8

#: How old (s) a lease may be, at most, to be handed on (and a sixth of the lease: the
#: run handed it starts well before the pool process would have to renew it).
HAND_ON_AGE = 0.5

#: The key of a lease's record (the request's admitted lease) that counts the runs it
#: was handed on to.
HANDED_ON = "handed_on"


class MainRelease:
    """How the worker's main process gives back the lease ``handed`` (a
    :meth:`~..engine.admission.Lease.handover` record) of a run under ``limits``:
    ``release()``; or the lease is handed on (see :meth:`fresh`).

    The bounds of the hand-on are worked out once, as the lease is taken (``until``:
    when, monotonic, it is too old to be handed on; never, where it may not be at all),
    and carried from run to run as it is handed on (:meth:`passed_on`), so that the end
    of each run looks at one clock reading, not at the record."""

    __slots__ = ("handed", "limits", "release", "token", "until")

    def __init__(self, handed: Dict[str, Any], limits: TaskLimits,
                 release: Callable[[], None], until: Optional[float] = None,
                 token: str = "") -> None:
        self.handed, self.limits, self.release = handed, limits, release
        self.until = _until(handed, limits) if until is None else until
        #: The holder token of the lease (see :func:`token_of`), once worked out.
        self.token = token

    def __call__(self) -> None:
        self.release()

    def fresh(self) -> bool:
        """Whether the lease may be handed on now (from the bounds worked out as it was
        taken: :func:`_until`)."""
        return time.monotonic() < self.until

    def pass_on(self, task_id: str) -> Tuple[Dict[str, Any], Optional[MainRelease]]:
        """This lease handed on to run ``task_id`` of this worker (noted: see
        :func:`token_of`): its record for that run (:func:`handed_on`), and how that run
        gives it back, under the same bounds with one run fewer left; None when the
        release cannot be remade for the new record (the caller makes it): a release
        that is not a ``functools.partial`` whose last argument is the record."""
        record = self.handed
        handed = handed_on(record)
        token = self.token or _token(handed)
        note(task_id, handed, token)
        give = self.release
        if not (type(give) is functools.partial and give.args and give.args[-1] is record):
            return handed, None
        until = self.until if handed[HANDED_ON] < HAND_ON_RUNS else _NEVER
        return handed, MainRelease(handed, self.limits,
                                   functools.partial(give.func, *give.args[:-1], handed), until,
                                   token)


_NEVER = float("-inf")


def _until(handed: Mapping[str, Any], limits: TaskLimits) -> float:
    """Until when (monotonic) the lease ``handed`` of a run under ``limits`` that ended
    may be handed on to another run of the same limits (slots only, constant keys: see
    :func:`alike_runs`; fewer than :data:`HAND_ON_RUNS` runs so far, younger than
    :data:`HAND_ON_AGE` and a sixth of its lease); :data:`_NEVER` when it may not be."""
    if runs_handed_on(handed) >= HAND_ON_RUNS or handed.get("parts"):
        return _NEVER
    taken = float(handed.get("taken") or "-inf")
    if not alike_runs(limits):
        return _NEVER
    return taken + min(HAND_ON_AGE, float(handed["lease"]) / 6)


def alike_runs(limits: TaskLimits) -> bool:
    """Whether every run under ``limits`` asks for the same slots and nothing else (no
    rate, no period, no uniqueness; constant keys and costs)."""
    known = _alike.get(id(limits))
    if known is not None and known[0] is limits:
        return known[1]
    alike = (bool(limits.rules) and limits.unique is None and limits.period is None
             and all(rule.rate is None and rule.slots is not None and rule.is_constant
                     for rule in limits.rules))
    _alike[id(limits)] = (limits, alike)
    return alike


_alike: Dict[int, Any] = {}


def runs_handed_on(handed: Mapping[str, Any]) -> int:
    """How many runs in a row the lease ``handed`` was handed on to (:data:`HANDED_ON`)."""
    return int(handed.get(HANDED_ON) or 0)


def handed_on(handed: Mapping[str, Any]) -> Dict[str, Any]:
    """The record of ``handed`` for the next run it is handed on to."""
    return {**handed, HANDED_ON: runs_handed_on(handed) + 1}


#: The holder tokens of the runs of this worker that were handed a slot, by task id,
#: until their end is handled (the oldest dropped past :data:`_KEPT`).
_tokens: OrderedDict[str, str] = OrderedDict()
_KEPT = 10_000


def note(task_id: str, handed: Mapping[str, Any], token: str = "") -> None:
    """Run ``task_id`` holds the slot of ``handed``, handed on to it (``token``: the
    lease's holder token, when the caller knows it)."""
    _tokens[task_id] = token or _token(handed)
    if len(_tokens) > _KEPT:
        _tokens.popitem(last=False)


def _token(handed: Mapping[str, Any]) -> str:
    """The holder token of the lease ``handed``."""
    return str(handed["member"]).split(" ", 1)[0]


def forget(task_id: str) -> None:
    """The end of run ``task_id`` is handled."""
    _tokens.pop(task_id, None)


def token_of(task_id: str) -> Optional[str]:
    """The holder token of the slot handed on to run ``task_id`` of this worker, if any
    (it names the run the slot was first taken for)."""
    return _tokens.get(task_id)
