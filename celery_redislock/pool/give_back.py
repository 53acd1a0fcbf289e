"""The end of a run: its slots given back, by the process that runs it or, for a run the
worker's main process was admitted to, by the main process; and the releases left for a
process's next request written before it exits.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Mapping

from celery.signals import worker_process_shutdown, worker_shutdown
from redis.exceptions import RedisError

from ..config.limit import TaskLimits
from ..engine.admission import Lease
from ..engine.channel import settle_all
from ..engine.keeper import lease_keeper
from .attempt import Setup
from .store_errors import LEASE_ENDS, not_given_back

logger = logging.getLogger(__name__)


def release_for_pool(task: Any, limits: TaskLimits, handed: Mapping[str, Any]) -> None:
    """Give back, from the worker's main process, the lease it was admitted to for a run
    that a pool process has ended (:data:`MAIN_RELEASES`), as :func:`give_back` does:
    the release goes out with this thread's next request to the lock store (usually
    the next run's admission), or from the lease keeper within about 10 ms.

    A pool process that came to the run too late to take it over unadopted adopted it
    under a description of its own, and released it itself: this release then finds
    nothing to free."""
    setup = Setup.of(task, limits)
    lease = Lease.of_handover(setup.client, handed)
    _releasing(task, None, lease,
               lambda: lease.release_soon(setup.publish, with_next_request=True))


def give_back(task: Any, lease: Lease, request: Any,
              publish: Callable[[Any], Any]) -> None:
    """Release ``lease``; if Redis cannot be reached, its lease runs out by itself.

    A worker's run does not wait for the answer, and its release goes out with the
    process's next request to the lock store (usually its next run's admission), or
    from the lease keeper within about 10 ms (see :meth:`Lease.release_soon`): also
    when the run stores a result or has a chain, a callback or a chord. Whoever
    learns of the run's end and asks for the slot before the release is written (the
    chain's next step, a client that read the result) finds it taken, parks, and is
    handed the slot by that release. A lease that
    took the last free slot, or found a line, is released at once and waits for the
    answer, which hands the slot over. An eager run waits for the answer, so that its
    caller finds the slot free the moment it returns. ``publish`` owes the moves of the
    parked line handed the freed slot."""
    lease_keeper().forget(lease)
    release = (partial(lease.release_handing_over, publish) if request.is_eager
               else partial(lease.release_soon, publish, with_next_request=True))
    if _releasing(task, request.id, lease, release):
        logger.debug("celery-redislock: task %s[%s] released %r", task.name, request.id,
                     lease.name)


def give_back_exiting(task: Any, lease: Lease, request: Any) -> None:
    """Release ``lease`` now, reserving no slot for a parked line, for a run whose body
    ``SystemExit`` ended: its process is exiting, or being killed (a hard time limit, a
    terminating revoke: the pool sends SIGTERM, then SIGKILL 0.1 s later). A move out
    of a parking queue owed to this process's mover could die with the process, and the
    slot would stay reserved for the line, free for nobody, until the reservation lapsed
    (:data:`~.handoff.RESERVATION`, 10 s); a slot simply freed is handed to the line by
    the next poll of any worker (every :data:`~..line.poll.POLL` s). Should the process
    be killed before the release is written, the worker's main process frees the slot
    once the process is gone (:mod:`.recovery`)."""
    lease_keeper().forget(lease)
    _releasing(task, request.id, lease, lease.release_unreserved,
               "the worker frees them once the process is gone, or their lease ends")


def give_back_unstarted(task: Any, limits: TaskLimits, handed: Mapping[str, Any]) -> None:
    """Give back at once the lease the worker's main process was admitted to (``handed``,
    see :mod:`.main_process`) for a run that will not start after all (revoked
    while its limits were asked), instead of leaving it until it runs out."""
    lease = Lease.of_handover(Setup.of(task, limits).client, handed)
    if lease.holds_slots:
        _releasing(task, None, lease, lease.release)


def _releasing(task: Any, task_id: Any, lease: Lease, release: Callable[[], Any],
               then: str = "") -> bool:
    """Call ``release`` (it gives ``lease`` back); False when the lock store failed it,
    which :func:`.store_errors.not_given_back` says, with what becomes of the slots
    (``then``; by default, they come back within the lease)."""
    try:
        release()
    except RedisError as exc:
        run = f"{task.name}[{task_id}]" if task_id else task.name
        not_given_back(f"of {lease.name!r} held by task {run}", exc,
                       then or f"{LEASE_ENDS}, within {lease.lease_seconds:.0f} s",
                       task=task, task_id=task_id, key=lease.name)
        return False
    return True


@worker_process_shutdown.connect
@worker_shutdown.connect
def _settle_releases(**_: Any) -> None:
    """A pool child (or a solo or threads worker) that exits first writes the releases
    left for its next request and reads the answers to its last releases, so that every
    slot comes back and one freed for a waiting line is still handed over."""
    settle_all()
