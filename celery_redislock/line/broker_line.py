"""The parking line's wiring for a run's admission (``redislock_line = "broker"``): the
lock store's references (:mod:`~celery_redislock.engine.parking`) as a run asks.

* :func:`parks` says whether a run waits on this line: the setting, a worker with an
  event loop (the gate's main process; without one the process that runs it parks it,
  :mod:`..pool.pool_park`); a run whose limits lie in several hash slots of a Redis
  Cluster is sent back with a countdown (one copy, in no line), said once in the log;
* :func:`prepare` is the admission's one script (a moved copy asks with its
  :class:`ParkRef`);
* :func:`parked_ref`, :func:`parked_wait`: where a copy was parked, and the wait a
  parked copy carries.

Publishing a parked copy and the moves owed are :mod:`.moves`; the worker's poll for
slots freed without a release is :mod:`.poll`.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Optional, Sequence, Set

from ..config.settings import Settings
from ..engine import parking as store
from ..engine import parking_rate
from ..engine.admission import ParkRef
from ..run.waiting_run import WaitingRun

logger = logging.getLogger(__name__)

__all__ = ["ParkRef", "keep_served_ms", "parked_ref", "parked_wait", "parks",
           "prepare"]

_said: Set[str] = set()


def parks(settings: Settings, client: Any, limiters: Sequence[Any], *, loop: bool,
          task_name: str, max_wait: Optional[float] = None) -> bool:
    """Whether a run of ``task_name`` under ``limiters`` waits on the parking line from
    the main process of a worker with an event loop (``loop``):
    semaphores and rate limits of any cost, all or nothing in one script (one rate limit
    of cost 1 alone: :mod:`..engine.parking_rate`, else ``lua/parked_rates.lua``), with
    their ``lock_max_wait`` kept (:mod:`.parked_deadline`). A run whose limits lie in
    several hash slots of a Redis Cluster (one script cannot decide them all at once)
    is sent back with a countdown instead, one copy, logged once per task."""
    if store.parks(client, limiters):
        return loop  # without an event loop, the process that runs it parks it
    say_no_park(task_name, "on Redis Cluster it parks runs whose limits lie in one hash "
                           "slot (one limit, or a semaphore and a rate of one name)")
    return False


def say_no_park(task_name: str, why: str) -> None:
    """Log once per task that its runs cannot park, and ``why``: a refused run is sent
    back with a countdown (one copy, in no line)."""
    if task_name not in _said:
        _said.add(task_name)
        logger.warning("celery-redislock: task %s cannot park its runs (%s): a refused run "
                       "is sent back with a countdown", task_name, why)


def prepare(client: Any, limiters: Sequence[Any], ask: store.ParkAsk) -> Optional[Any]:
    """The admission's one script for the run of ``ask`` (None: keep today's line). A
    paused semaphore parks the run too (one message, handed over once the pause ends),
    rather than sending it back with a countdown. A run of one rate limit whose start is
    within ``ask.book_ms`` is booked it (held here, no broker round trip), else it parks
    in the rate key's parking queue (:mod:`..engine.parking_rate`). Any other mix
    (semaphores and rate limits, several rates, a cost above 1) is decided all or nothing
    in one script (``lua/parked_rates.lua``): a far start parks the run at its rate's
    line, promised that start, and it holds no slot while it waits. ``ask.priority``
    (:func:`.priority.priority_of`): the band it waits in, higher first."""
    if parking_rate.rate_parks(client, limiters):
        return parking_rate.prepare_rate_admit(client, limiters, ask)
    return store.prepare_park_admit(client, limiters, replace(ask, park_paused=True))


def parked_ref(waited: WaitingRun) -> Optional[ParkRef]:
    """Where the copy carrying ``waited`` was parked (None: a copy never parked)."""
    return ParkRef(waited.line, waited.park_id) if waited.parked else None


def parked_wait(waited: WaitingRun, ref: ParkRef, since: Optional[int]) -> WaitingRun:
    """The wait a parked copy carries (version 2 of the header: its park id and line)."""
    return WaitingRun(since=waited.since or since, attempts=waited.attempts + 1,
                      park_id=ref.park_id, line=ref.key, carried=True)


def keep_served_ms(task: Any) -> int:
    """How long a served reference is kept (ms): as long as the broker may give back a
    copy of the run: its visibility timeout (kombu's default for Redis: one hour), with
    a margin for the transport's restore cycle."""
    options = task.app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return int(max(2 * timeout, timeout + 60) * 1000)
    return store.KEEP_SERVED_MS

