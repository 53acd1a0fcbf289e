"""The gate's thin path: the ask of a newcomer of a slots-only task, without the generic
attempt.

**When it is taken.** The worker's main process asks for a run that a pool process
(or the look-ahead) can take now, on an event loop (``redislock_gate = "async"``, the
parking line, a plain ``redis://`` lock store), when

* its task's limits are slots only: one semaphore of cost 1, a constant key, no rate, no
  ``fair_by``, no ``lock_max_wait``, no uniqueness, no period (:func:`thin_of`, worked
  out once per task and kept on it);
* the run is a newcomer: not a copy of a waiting run's message (no wait header), not
  redelivered, no promise or booked start held for it;
* the main process asks the lock store (no pause after a failure of the store).

Everything else asks through the generic path (:func:`~.main_process.ask_before_pool`).

**What it does.** The same script with the same keys and arguments as the generic path
(:class:`~..engine.slots_ask.SlotsAsk`, made once per task and priority band), sent on
the worker's connection to the store (:mod:`.hub_store`); the reply comes back to one
object (:class:`_Reply`, no closures). An admission is the lease record the generic
path would hand to the pool; the gate then acts on it as on the generic answer
(:func:`~.gate._act_on_answer`). Any other reply, or a failure of the store, is handed
to the generic path as if it had asked (:func:`~.main_process.asking_of`): it parks the
run, ends it, holds it or reports the failure exactly as it would have.

    >>> Thin.__slots__
    ('asks', 'client', 'limiter', 'limits', 'low_first', 'name', 'setup', 'store')
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..config.limit import TaskLimits
from ..engine.admission import new_token, owner_prefix
from ..engine.parking import run_id
from ..engine.slots_ask import SlotsAsk, thin_limiter
from ..line.priority import priority_of
from ..pool.attempt import Setup, describe_holder, shown_args
from ..run.limited import this_start
from .hub_store import HubStore, hub_store
from .main_process import MAIN_PROCESS_TIMEOUT, asking_of, store_answered, store_asked
from .task_context import context_of

logger = logging.getLogger(__name__)

#: Where a task keeps its thin path (see :func:`thin_of`).
THIN_ATTRIBUTE = "_redislock_thin"


class Thin:
    """A slots-only task's thin path (see the module): its setup, its one semaphore, and
    its asks per priority band."""

    __slots__ = ("asks", "client", "limiter", "limits", "low_first", "name", "setup",
                 "store")

    def __init__(self, name: str, setup: Setup, limiter: Any) -> None:
        self.name, self.setup, self.limits, self.limiter = name, setup, setup.limits, limiter
        self.client, self.low_first = setup.client, setup.low_first
        self.asks: Dict[int, Optional[SlotsAsk]] = {}
        #: The worker's connection to the store, once found (per consumer: see :meth:`on`).
        self.store: Optional[tuple] = None

    def ask_of(self, band: int) -> Optional[SlotsAsk]:
        """The ask of band ``band``, made on first use."""
        ask = self.asks.get(band, False)
        if ask is False:
            retry = self.limits.retry
            ask = self.asks[band] = SlotsAsk.of(
                self.client, self.limiter, lease=self.limits.lease, band=band,
                keep_served_ms=self.setup.keep_served_ms,
                priority_aging=retry.priority_aging)
        return ask  # type: ignore[return-value]

    def on(self, consumer: Any) -> Optional[HubStore]:
        """``consumer``'s connection to this task's lock store (None: it has none)."""
        known = self.store
        if known is not None and known[0] is consumer:
            return known[1]  # type: ignore[no-any-return]
        store = hub_store(consumer, self.client, MAIN_PROCESS_TIMEOUT)
        self.store = (consumer, store)
        return store


def thin_of(task: Any, limits: TaskLimits) -> Optional[Thin]:
    """``task``'s thin path when its ``limits`` allow one (see the module), else None;
    worked out on its first run and kept on the task."""
    known = task.__dict__.get(THIN_ATTRIBUTE)
    if known is not None and known[0] is limits:
        return known[1]  # type: ignore[no-any-return]
    thin = _made(task, limits)
    setattr(task, THIN_ATTRIBUTE, (limits, thin))
    return thin


def _made(task: Any, limits: TaskLimits) -> Optional[Thin]:
    if (len(limits.rules) != 1 or limits.unique is not None or limits.period is not None
            or limits.retry.max_wait is not None):
        return None
    rule = limits.rules[0]
    if rule.rate is not None or rule.slots is None or not rule.is_constant:
        return None
    setup = Setup.of(task, limits)
    settings = setup.settings
    if not (settings.enabled and settings.gate == "async" and settings.line == "broker"):
        return None
    limiter = thin_limiter(limits.limiters((), {}, settings.prefix))
    return None if limiter is None or setup.client is None else Thin(task.name, setup, limiter)


class Gate(NamedTuple):
    """What the gate lends this module: ``act(consumer, request, handle, hold, limits,
    answer, ahead)`` acts on an answer (:func:`~.gate._act_on_answer`);
    ``settle(consumer, request, handle, hold, limits, step, ahead)`` carries out the
    generic path's step (:func:`~.gate._settle`)."""

    act: Callable[..., Any]
    settle: Callable[..., Any]


def ask(thin: Thin, consumer: Any, request: Any, handle: Callable[[Any], Any], hold: Any,
        ahead: bool, may_wait: bool, gate: Gate) -> bool:
    """Send the thin ask of ``request`` (not revoked, that a pool process or the
    look-ahead can take now), its reply acted on by ``gate``: True. False: the generic
    path asks (see the module). ``may_wait``: as the generic ask's, for its fallback."""
    try:
        prepared = _prepared(thin, consumer, request, hold)
    except Exception:  # the generic path asks, and reports what fails as it does
        prepared = None
    if prepared is None or not store_asked():  # paused: the generic path holds the run
        return False
    store, slots, token, description, args = prepared
    store.run_script(slots.script, slots.keys, args, _Reply(
        thin, consumer, request, handle, hold, ahead, may_wait, gate, slots, token,
        description, args))
    return True


def _prepared(thin: Thin, consumer: Any, request: Any,
              hold: Any) -> Optional[Tuple[HubStore, SlotsAsk, str, str, List[Any]]]:
    """The connection, the ask and the holder token, description and script arguments of
    ``request`` held as ``hold``; None when the generic path asks (see the module)."""
    fields = request._request_dict
    if hold.copy or hold.promises or hold.booked is not None or fields.get(
            "delivery_info", {}).get("redelivered"):
        return None
    store = thin.on(consumer)
    if store is None:
        return None
    slots = thin.ask_of(priority_of(thin.limits.retry.priority, request, thin.low_first))
    if slots is None:
        return None
    task_id, worker = request.id, request.hostname
    token = owner_prefix(worker or "", task_id or "", this_start(worker)) + new_token()
    description = describe_holder(thin.name, worker, task_id, pid=None,
                                  args=shown_args(request))
    return store, slots, token, description, slots.args(
        token, description, run_id(task_id, fields.get("retries") or 0))


class _Reply:
    """The reply to one thin ask, handed on: an admission to ``gate.act``, anything else
    to the generic path (an object, not a closure: see :class:`~..engine.hub_store.
    HubStore`'s callbacks)."""

    __slots__ = ("ahead", "args", "consumer", "description", "gate", "handle", "hold",
                 "may_wait", "request", "slots", "thin", "token")

    def __init__(self, thin: Thin, consumer: Any, request: Any, handle: Any, hold: Any,
                 ahead: bool, may_wait: bool, gate: Gate, slots: SlotsAsk, token: str,
                 description: str, args: Any) -> None:
        self.thin, self.consumer, self.request, self.handle, self.hold = (
            thin, consumer, request, handle, hold)
        self.ahead, self.may_wait, self.gate, self.slots = ahead, may_wait, gate, slots
        self.token, self.description, self.args = token, description, args

    def __call__(self, reply: Any) -> Any:
        try:
            handed = self.slots.admitted(reply, self.token, self.description)
        except (ValueError, TypeError):  # not what an admission answers: the generic path
            handed = None
        if handed is None:
            return self._generic(reply)
        store_answered()
        return self.gate.act(self.consumer, self.request, self.handle, self.hold,
                             self.thin.limits, handed, self.ahead)

    def _generic(self, reply: Any) -> Any:
        """Read ``reply`` as the generic path reads its own (it parks the run, ends it,
        holds it, or reports the store's failure)."""
        request, hold, limits = self.request, self.hold, self.thin.limits
        call = self.slots.generic_call(self.token, self.description, self.args)

        def step() -> Any:
            asking = asking_of(request.task, limits, context_of(request), room=True,
                               promises=hold.promises, may_wait=self.may_wait, loop=True)
            assert asking is not None  # on an event loop, the main process parks a run
            return asking.replied(call, reply)

        return self.gate.settle(self.consumer, request, self.handle, hold, limits, step,
                                self.ahead)
