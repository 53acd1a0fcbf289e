"""One run asking its limits: what every step of its admission needs, in either process.

:class:`Setup` is what every run of a task takes from its app and limits (worked out on
its first run, kept on the task object); :class:`Attempt` is one run's admission: its
limiters, how its holder entry describes it, the wait its message carries, and the one
call that asks the lock store. The request fields by which the worker's main process
hands a run to its pool process (:data:`ADMITTED`, :data:`MAIN_RELEASES`,
:data:`PROMISED`) are named here, where the pool process's attempt reads them.

    >>> outcome_time(None)
    0
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ..config.limit import TaskLimits
from ..config.settings import Settings, redis_client
from ..engine.admission import Lease, Outcome, admit, declare_longest_lease, owner_prefix
from ..engine.parking import ParkAsk, run_id
from ..line import broker_line, handoff
from ..line.priority import priority_of, serves_low_first
from ..line.waiting import SHORT_WAIT
from ..run.limited import longest_lease, task_settings, this_start
from ..run.waiting_run import WaitingRun

_described: Dict[Any, str] = {}
os.register_at_fork(after_in_child=_described.clear)

#: A string as JSON text (what ``json.dumps`` does with a ``str``, without its overhead).
_json_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


#: The most characters of a run's arguments (Celery's ``argsrepr`` and ``kwargsrepr``,
#: what Flower shows) that its holder entry keeps for operators.
ARGS_SHOWN = 200


def shown_args(request: Any) -> Optional[str]:
    """A run's arguments as Celery wrote them for people (``argsrepr``, then
    ``kwargsrepr`` unless empty), cut to :data:`ARGS_SHOWN`; None when it has none:
    what its holder entry shows (:func:`describe_holder`).

        >>> from types import SimpleNamespace
        >>> shown_args(SimpleNamespace(argsrepr="(1, 2)", kwargsrepr="{}"))
        '(1, 2)'
        >>> shown_args(SimpleNamespace()) is None
        True
    """
    args = getattr(request, "argsrepr", None)
    kwargs = getattr(request, "kwargsrepr", None)
    shown = " ".join(str(part) for part in (args, kwargs) if part and part != "{}")
    if len(shown) > ARGS_SHOWN:
        shown = shown[:ARGS_SHOWN - 1] + "\u2026"
    return shown or None


def describe_holder(task_name: str, worker: Any, task_id: Any, pid: Optional[int] = -1,
                    args: Optional[str] = None) -> str:
    """Who holds a slot, for operators: JSON with the task, its id, the worker, the process
    (this one, unless ``pid`` says another, or None for none) and the run's arguments
    as Celery shows them (:func:`shown_args`), if any: the description of its holder
    entry in the lock store, in either process (the pool's attempt or the thin ask).

    The part that only changes with the process is made once per task and process."""
    start = _described.get((task_name, worker, pid))
    if start is None:
        pid_text = "null" if pid is None else os.getpid() if pid == -1 else pid
        start = _described[(task_name, worker, pid)] = (
            f'{{"task": {json.dumps(task_name)}, "worker": {json.dumps(worker)}, '
            f'"pid": {pid_text}, "id": '
        )
    task_id = _json_string(task_id) if type(task_id) is str else json.dumps(task_id)
    if args is None:
        return f"{start}{task_id}}}"
    return f'{start}{task_id}, "args": {_json_string(args)}}}'


#: The request field that carries a lease the worker's main process was admitted to, for
#: the pool process that runs the task to adopt (see :mod:`.main_process`).
ADMITTED = "redislock_admitted"


#: The key of an admitted lease's record (:data:`ADMITTED`) that says the worker's main
#: process gives it back when it learns of the run's end (see :mod:`.give_back`):
#: the pool process neither adopts it nor releases it, unless it comes to it too late
#: for that (see :func:`~..engine.admission.handed_young`), and only renews it should
#: the run last that long.
MAIN_RELEASES = "main_releases"


#: The request field that carries the start times rate limiters promised a run while the
#: worker's main process held it back (see :mod:`.main_process`), for the pool
#: process that asks with them (a run the main process found admissible but could not
#: take yet: it may start once its pool process asks).
PROMISED = "redislock_promised"


@dataclass(frozen=True)
class Setup:
    """What every run of a task under ``limits`` takes from its app and limits: worked
    out on its first run and kept on the task object."""

    limits: TaskLimits
    settings: Settings
    client: Any
    #: How long a slot handed to one of its runs stays reserved (worker runs).
    reserve_ms: int
    #: Owes the moves of parked lines handed a slot (see :mod:`.handoff`).
    publish: Callable[[Any], Any]
    #: How long a served reference of the parking line is kept (ms; see
    #: :func:`.broker_line.keep_served_ms`): read from the app's broker settings once.
    keep_served_ms: int
    #: Its broker serves a message priority of 0 first (Redis; see :mod:`.priority`).
    low_first: bool = False
    #: :meth:`parks`' last answer: for the limiters (the same list for every run of a
    #: task with constant limits), and whether the worker had an event loop.
    _parks: Dict[bool, Tuple[Sequence[Any], bool]] = field(
        default_factory=dict, compare=False, repr=False)

    def parks(self, limiters: Sequence[Any], loop: bool, task_name: str) -> bool:
        """Whether a run under ``limiters`` waits on the parking line (see
        :func:`.broker_line.parks`), worked out once for constant limiters."""
        known = self._parks.get(loop)
        if known is not None and known[0] is limiters:
            return known[1]
        parks = broker_line.parks(self.settings, self.client, limiters, loop=loop,
                                  task_name=task_name, max_wait=self.limits.retry.max_wait)
        self._parks[loop] = (limiters, parks)
        return parks

    @classmethod
    def of(cls, task: Any, limits: TaskLimits) -> Setup:
        setup = getattr(task, "_redislock_setup", None)
        if setup is None or setup.limits is not limits:
            settings = task_settings(task)
            client = redis_client(task._get_app(), settings) if settings.enabled else None
            if client is not None:  # the grace after a loss of the store covers it
                declare_longest_lease(client, longest_lease(task._get_app(), limits.lease))
            setup = task._redislock_setup = cls(
                limits=limits,
                settings=settings,
                client=client,
                reserve_ms=handoff.reservation_ms(limits.lease),
                publish=functools.partial(handoff.publish, task.app),
                keep_served_ms=broker_line.keep_served_ms(task),
                low_first=serves_low_first(task.app),
            )
        return setup


@dataclass
class Attempt:
    """One run of a task asking its limits for admission: what every step needs."""

    task: Any
    setup: Setup
    request: Any
    limiters: Sequence[Any]
    description: str
    owner: str
    #: The wait so far, as the message carries it.
    waited: WaitingRun
    promises: Dict[str, int]
    #: Eager runs have no queue to go back to, nor a broker to hand slots over through.
    eager: bool
    reserve_ms: int
    #: It waits on the parking line (``redislock_line = "broker"``; see :mod:`.broker_line`).
    parking: bool = False
    #: It parks from the process that runs it and confirms its copy's publish within this
    #: many ms (:mod:`.pool_park`; 0: its message stays unacknowledged until parked).
    unsent_ms: int = 0

    @classmethod
    def of(cls, task: Any, setup: Setup, args: Sequence[Any], kwargs: Mapping[str, Any],
           request: Any, pid: Optional[int] = -1) -> Attempt:
        """The attempt of ``request``; its holders described with the process ``pid``
        (this one; None: no process yet, the main process's admission: a lost pool
        process's slots are then freed once the process its request was accepted by is
        gone, see :func:`~..gate.recovery.free_run_slots`)."""
        waited = WaitingRun.of(request)
        eager = bool(request.is_eager)
        promises = dict(waited.promises)
        promises.update(getattr(request, PROMISED, None) or {})
        return cls(
            task=task, setup=setup, request=request,
            limiters=setup.limits.limiters(args, kwargs, setup.settings.prefix),
            description=describe_holder(task.name, request.hostname, request.id, pid=pid,
                                        args=shown_args(request)),
            owner=owner_prefix(request.hostname or "", request.id or "",
                               this_start(request.hostname)),
            waited=waited, promises=promises,
            eager=eager, reserve_ms=0 if eager else setup.reserve_ms,
        )

    def admit(self, probe: bool = False, book_ms: int = 0) -> Outcome:
        """One admission attempt (a probe, a booking: see :func:`admit`); the hand-offs
        it brings are published at once. On the parking line (``parking``: a pool
        process, see :mod:`.pool_park`), its one script."""
        if self.parking:
            call = broker_line.prepare(self.setup.client, self.limiters, self.park_ask())
            if call is not None:
                return self.published(call.outcome(
                    call.script.run(self.setup.client, call.keys, call.args)))
        return self.published(admit(
            self.setup.client, self.limiters, lease=self.setup.limits.lease,
            description=self.description, promises=self.promises, owner=self.owner,
            reserve_ms=self.reserve_ms, probe=probe, book_ms=book_ms))

    def park_ask(self, book_ms: int = 0) -> ParkAsk:
        """This run's ask of the parking line (:func:`.broker_line.prepare`), with its
        priority (:func:`.priority.priority_of`)."""
        retry = self.setup.limits.retry
        priority = priority_of(retry.priority, self.request, self.setup.low_first)
        return ParkAsk(lease=self.setup.limits.lease,
                       run=run_id(self.request.id, self.request.retries or 0),
                       parked=broker_line.parked_ref(self.waited),
                       description=self.description, owner=self.owner,
                       keep_served_ms=self.setup.keep_served_ms, max_wait=retry.max_wait,
                       book_ms=book_ms, priority=priority,
                       priority_aging=retry.priority_aging,
                       copy=self.waited.move, unsent_ms=self.unsent_ms)

    def published(self, outcome: Any) -> Any:
        """``outcome``, the hand-offs it brings published."""
        if outcome.handoffs:
            handoff.publish(self.task.app, outcome.handoffs)
        return outcome


def short_wait_of(task: Any, request: Any) -> float:
    """How long (seconds) a run of ``task`` may wait for its start in the worker process:
    :data:`~celery_redislock.line.waiting.SHORT_WAIT`, and at most a quarter of
    any time limit of the run, whose clock runs while it waits."""
    limits = [*(getattr(request, "timelimit", None) or ()),
              getattr(task, "time_limit", None), getattr(task, "soft_time_limit", None)]
    return min([SHORT_WAIT, *(limit / 4 for limit in limits
                              if isinstance(limit, (int, float)) and limit > 0)])


def outcome_time(outcome: Any) -> int:
    """The server time (ms) an admission attempt saw, or 0 when unknown."""
    if isinstance(outcome, Lease):
        return outcome.acquired_at_ms
    return getattr(outcome, "server_time_ms", 0)


def limit_names(limiters: Sequence[Any]) -> str:
    return ", ".join(repr(limiter.name) for limiter in limiters)
