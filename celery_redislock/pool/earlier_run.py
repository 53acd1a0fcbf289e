"""A redelivered message that meets the earlier run of its task id still holding a slot.

A message may be delivered again while the run of its first delivery still holds a
live lease (``acks_late``, the broker's visibility timeout). Admitted (slots were
free), the new run runs beside the earlier one, as Celery alone would run it, and a
warning says so. Refused where it cannot park (a run sent back with a countdown), it
*follows* the earlier run (:func:`follow`): a copy that takes no slot and looks at that
run each time it comes back, ending without running once the run ended, or carrying on
as a waiting run once the run was lost. The functions here publish and say; the
interpreters (:mod:`.main_process`, :mod:`.pool_process`) end the run.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence

from redis.exceptions import RedisError

from ..engine.admission import FREED_AS_LOST, Lease, SlotLimit, holder_lease_end
from ..engine.holder import parse_holder, unit_of
from ..line.waiting import publish, visibility_ceiling
from ..run.waiting_run import WaitingRun
from .attempt import Attempt, outcome_time

logger = logging.getLogger(__name__)


def look_at_earlier(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any],
                    outcome: Any) -> bool:
    """Look for the earlier run of a redelivered message's task id, after the admission
    answered ``outcome``: True when this run was sent back to follow it (the caller ends
    this copy). Admitted (slots were free), it runs beside that run, as Celery alone
    would run it: a warning says so. Refused, it follows that run (:func:`follow`)
    rather than running the task again as soon as the earlier run ended: a body longer
    than the visibility timeout would then run again and again. Without a live earlier
    run, the run goes on as any other."""
    task, request = attempt.task, attempt.request
    if outcome is None:
        return False  # the lock store did not answer: nothing to look at
    try:
        earlier = find_earlier(attempt.setup.client, attempt.limiters, request.id, outcome)
    except RedisError:
        return False
    if earlier is None:
        return False
    if isinstance(outcome, Lease):
        logger.warning(
            "celery-redislock: task %s[%s] was redelivered while an earlier run of it still "
            "holds a slot of %r; this run runs beside it (slots were free)",
            task.name, request.id, earlier["name"])
        return False
    follow(task, request, args, kwargs, earlier, follow_countdown(attempt))
    return True


def find_earlier(client: Any, limiters: Sequence[Any], task_id: str,
                 outcome: Any) -> Optional[Dict[str, Any]]:
    """The live holder entry of another run of ``task_id`` in one of the semaphores of
    ``limiters``: its semaphore's key and name, its member, when it took the slot and
    when its lease ends (server ms); or None."""
    marker = f"|{task_id}|"
    own = outcome.token if isinstance(outcome, Lease) else None
    for limiter in limiters:
        if not isinstance(limiter, SlotLimit):
            continue
        live = client.zrangebyscore(limiter.key, f"({outcome_time(outcome)}", "+inf",
                                    withscores=True)
        for member, score in live:
            holder = parse_holder(member, score)
            if unit_of(holder.member) is not None:
                continue  # a weighted holder's further slot: its entry is listed too
            if marker in holder.token and holder.token != own:
                return {"key": limiter.key, "name": limiter.name, "member": holder.member,
                        "since": holder.acquired_ms, "until": holder.lease_end_ms}
    return None


def follow_countdown(attempt: Attempt) -> float:
    """How long a run that follows an earlier one waits between looks: a quarter of the
    lease (renewals keep the lease at least two thirds of its length ahead, so a run
    that ended is told from one whose lease ran out), within the broker's visibility
    timeout."""
    countdown = max(attempt.setup.limits.lease / 4, 0.05)
    ceiling = visibility_ceiling(attempt.task)
    return countdown if ceiling is None else min(countdown, ceiling)


def follows_on(attempt: Attempt, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """A run that follows an earlier run of its task (see :func:`follow`) looks at it:
    True when this copy ends here (the run still holds its slot: the copy was sent back
    to look again; or it ended before its lease did); False when it goes on to ask for
    a slot, as any waiting run (the run was freed by its worker as dead, or its lease
    ran out unrenewed: its whole worker died)."""
    earlier = dict(attempt.waited.follows or {})
    task, request = attempt.task, attempt.request
    try:
        now_ms, lease_end = holder_lease_end(attempt.setup.client, str(earlier["key"]),
                                             str(earlier["member"]))
    except RedisError:
        now_ms, lease_end = 0, int(earlier["until"])  # look again later
    if lease_end > 0:
        earlier["until"] = lease_end
        follow(task, request, args, kwargs, earlier, follow_countdown(attempt))
        return True
    if lease_end != FREED_AS_LOST and now_ms < int(earlier["until"]):
        logger.info("celery-redislock: task %s[%s]: the earlier run it followed has ended; "
                    "this copy of its message ends without running", task.name, request.id)
        return True
    logger.warning("celery-redislock: task %s[%s]: the earlier run it followed died (its "
                   "slot of %r was freed unreleased); this copy asks for a slot",
                   task.name, request.id, earlier.get("name"))
    attempt.waited = stop_following(request)
    return False


def follow(task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
           earlier: Mapping[str, Any], countdown: float) -> None:
    """Send a redelivered run back to *follow* the earlier run of its task, which still
    holds a slot (the caller then ends this copy).

    The copy sent back joins no waiting line and takes no slot: when it comes back it
    looks at that run (``earlier``: the semaphore ``key``, the holder ``member``, the
    end of its lease seen last, ``until``). While the run holds its slot, the copy goes
    back again; once the run has ended before its lease did, the copy ends without
    running (what Celery alone would have run beside it has run); once the run's lease
    ran out unrenewed (its worker died), the copy carries on as a waiting run, in the
    line by the time the run first asked (see :func:`follows_on`).
    """
    run = WaitingRun.of(request)
    wait = WaitingRun(since=run.since or earlier.get("since"), attempts=run.attempts + 1,
                      follows=dict(earlier), carried=True)
    headers = wait.on(getattr(request, "headers", None))
    signature = task.signature_from_request(
        request, args, kwargs, countdown=countdown, headers=headers, retries=request.retries,
    )
    publish(signature)
    logger.info("celery-redislock: task %s[%s] was delivered again while an earlier run of "
                "it holds a slot; it follows that run (back in %.2f s)", task.name,
                request.id, countdown)


def stop_following(request: Any) -> WaitingRun:
    """The run followed an earlier run that was lost: from now on it waits as any run
    does (its wait header no longer names the earlier run); its wait now."""
    run = WaitingRun.of(request).but(follows=None)
    run.put_on(request)
    return run
