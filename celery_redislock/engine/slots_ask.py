"""The thin ask: a newcomer's admission to one semaphore of cost 1 on the parking line,
its script's keys and arguments made once, not per run.

:func:`~.parking.prepare_park_admit` builds, for every run, its limiters, a
:class:`~.parking.ParkAsk`, the script's arguments group by group and, once admitted, a
:class:`~.admission.Lease` whose only use in the worker's main process is its
:meth:`~.admission.Lease.handover` record. For the common case it always builds the same
call but for five arguments. A :class:`SlotsAsk` is that call, made once by
:func:`~.parking.prepare_park_admit` itself (one semaphore of cost 1, a plain line, no
max wait, a run never parked, in one band), with the per-run arguments filled in by
:meth:`SlotsAsk.args`: the holder token, its description, the run, the store
incarnation seen and the grace bound. The same script (``admit_parked.lua``), the same
keys and arguments: the store cannot tell the two paths apart.

Its reply is read by :meth:`SlotsAsk.admitted`: an admission (the plain reply, no
hand-offs) is the record :meth:`~.admission.Lease.handover` gives for it; anything else
(a refusal that parks the run, a pause, a served reference, an admission with moves
owed) is ``None``: the caller reads it through the generic call
(:meth:`SlotsAsk.generic_call`), as if the generic path had asked.

    >>> import redis
    >>> client = redis.Redis.from_url(redis_url)
    >>> ask = SlotsAsk.of(client, SlotLimit("thin-doc", 1, "doc:"), lease=5.0, band=0)
    >>> args = ask.args("tok", '{"id": "t"}', "t:0")
    >>> record = ask.admitted(ask.script.run(client, ask.keys, args), "tok", '{"id": "t"}')
    >>> record["keys"], record["member"].startswith("tok "), record["contended"]
    (['doc:{ede91a2fef9915c3}:s:thin-doc'], True, False)
    >>> from celery_redislock.engine.admission import Lease
    >>> Lease.of_handover(client, record).release()
    True
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional

from .admission import SlotLimit, grace_bound_ms, saw_incarnation, seen_incarnation
from .holder import holder_member
from .parking import KEEP_SERVED_MS, ParkAdmitCall, ParkAsk, prepare_park_admit
from .scripts import LuaScript, is_cluster

__all__ = ["SlotsAsk", "thin_limiter"]

#: Where :func:`~.parking.prepare_park_admit` puts the per-run arguments of one
#: semaphore's call: token, description, run; the incarnation seen and the grace bound.
_TOKEN, _DESCRIPTION, _RUN, _SEEN, _GRACE = 0, 2, 3, 9, 10


def thin_limiter(limiters: Any) -> Optional[SlotLimit]:
    """The one semaphore of ``limiters`` when a thin ask may ask for it (one semaphore of
    cost 1 on a plain line, no rate); else None."""
    if len(limiters) != 1:
        return None
    limiter = limiters[0]
    if type(limiter) is not SlotLimit or limiter.cost != 1 or limiter.fair:
        return None
    return limiter


class SlotsAsk:
    """The admission call of a newcomer under one semaphore of cost 1, in one band of its
    line (see the module): :attr:`script`, :attr:`keys` and :meth:`args` to send,
    :meth:`admitted` to read the reply."""

    __slots__ = ("call", "client", "keys", "lease", "name", "reserve_ms", "script",
                 "template")

    def __init__(self, call: ParkAdmitCall) -> None:
        #: The call as :func:`~.parking.prepare_park_admit` made it (no token, no run).
        self.call = call
        self.client, self.keys, self.template = call.client, call.keys, call.args
        self.script: LuaScript = call.script
        self.name, self.lease, self.reserve_ms = (call.limiters[0].name, call.lease,
                                                  call.reserve_ms)

    @classmethod
    def of(cls, client: Any, limiter: SlotLimit, *, lease: float, band: int,
           keep_served_ms: int = KEEP_SERVED_MS,
           priority_aging: float = 10.0) -> Optional[SlotsAsk]:
        """The thin ask of a newcomer under ``limiter`` in band ``band`` (its priority,
        see :func:`~.fair.with_band`); None when the generic path must ask (not one
        semaphore of cost 1 on a plain line, or Redis Cluster)."""
        if thin_limiter([limiter]) is None or is_cluster(client):
            return None
        call = prepare_park_admit(client, [limiter], ParkAsk(
            lease=lease, run="", keep_served_ms=keep_served_ms, park_paused=True,
            priority=band, priority_aging=priority_aging))
        if call is None or len(call.keys) != 2 or len(call.limiters) != 1:
            return None
        return cls(call)

    def args(self, token: str, description: str, run: str) -> List[Any]:
        """The script's arguments for one run (the holder ``token`` and ``description``,
        its ``run`` id), as :func:`~.parking.prepare_park_admit` makes them."""
        args = self.template.copy()
        args[_TOKEN], args[_DESCRIPTION], args[_RUN] = token, description, run
        args[_SEEN] = seen_incarnation(self.client)
        args[_GRACE] = grace_bound_ms(self.client, self.lease)
        return args

    def admitted(self, reply: Any, token: str, description: str) -> Optional[Dict[str, Any]]:
        """The :meth:`~.admission.Lease.handover` record of an admission ``reply`` (the
        store's incarnation noted, as the generic call notes it); None for any other
        reply, which the generic call reads (:meth:`generic_call`)."""
        if type(reply) is bytes:
            reply = reply.decode()
        elif type(reply) is not str:
            return None
        now_ms, lease_end, fence, contended, last = map(int, reply.split())
        saw_incarnation(self.client, fence)
        return {"name": self.name, "fence": fence, "lease": self.lease, "at": now_ms,
                "end": lease_end, "keys": [self.keys[0]],
                "member": holder_member(token, now_ms, fence, description),
                "contended": bool(contended), "last": bool(last),
                "reserve": self.reserve_ms, "epoch": 0, "costs": [], "parts": [],
                "taken": time.monotonic()}

    def generic_call(self, token: str, description: str, args: List[Any]) -> ParkAdmitCall:
        """The generic call these ``args`` are (to read a reply :meth:`admitted` did not
        take: ``call.outcome(reply)``)."""
        return dataclasses.replace(self.call, token=token, description=description,
                                   args=args)

