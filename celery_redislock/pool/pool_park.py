"""Parking a run from the process that runs it (``redislock_line = "broker"``): a pool
process (``redislock_admit_before_pool = False``, or a run the main process left to
it), or a worker without an event loop (gevent, eventlet: the run asks in its own
greenlet). The admission is the parking line's one script, as in the main process
(:func:`.broker_line.prepare`); a refusal wrote the run's reference, and its copy is
published here, on this process's own :class:`~.parking.Mover`, built from the request
as Celery builds a task message (protocol 2, the task's serializer) with the parked
wait header. The run then ends (``Ignore``).

Windows (see docs/semantics.md): under default acks the original was acknowledged
before the body began, so a process that dies between the reference and the publish
loses the run, as Celery alone loses a run whose process dies (its body would have been
running). Its reference then waits for a copy that never comes: the run asks with
``unsent_ms`` (:data:`UNSENT_MS`), and :func:`sent` confirms the publish; unconfirmed by
then, the reference lapses (no longer counted as waiting, then forgotten once no copy
can come back: ``engine/lua/parked_unsent.lua``). Under ``acks_late`` the original is
acknowledged after the copy is parked, so the broker gives it back instead, and its
reference tells the copies apart.

    >>> PUBLISH_TIMEOUT, UNSENT_MS
    (10.0, 30000)
"""

from __future__ import annotations

import logging
import threading
from typing import Any, List, Mapping, Sequence

from kombu.serialization import dumps
from redis.exceptions import RedisError

from ..config.settings import Settings
from ..engine import parking as store
from ..engine.admission import ParkRef
from ..engine.parking_rate import is_rate_key
from ..line.moves import mover
from ..parking import ParkedCopy, Route, line_name, parking_queue
from ..run.waiting_run import WaitingRun

__all__ = ["PUBLISH_TIMEOUT", "UNSENT_MS", "copy_of_request", "park_here", "parks_here", "sent"]

logger = logging.getLogger(__name__)

#: How long (s) a run waits here for its parked copy to be published.
PUBLISH_TIMEOUT = 10.0

#: How long (ms) the lock store waits for the confirmation of a copy's publish
#: (:func:`sent`) before the run's reference lapses: three times :data:`PUBLISH_TIMEOUT`.
UNSENT_MS = int(PUBLISH_TIMEOUT * 3 * 1000)


def parks_here(settings: Settings, client: Any, limiters: Sequence[Any]) -> bool:
    """Whether a run under ``limiters`` parks from the process that runs it: the parking
    line is on and its limits are semaphores it takes (:func:`~..engine.parking.parks`)."""
    return store.parks(client, limiters)


def copy_of_request(task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                    ref: ParkRef, wait: WaitingRun) -> ParkedCopy:
    """The parked copy of the run of ``request`` in ``ref``'s line: its task message as
    Celery writes one (``app.amqp.as_task_v2``), its wait header ``wait``, routed back
    where the original was delivered from."""
    amqp = task.app.amqp
    headers, properties, body, _ = amqp.as_task_v2(
        request.id, task.name, list(args), dict(kwargs),
        group_id=request.group, group_index=getattr(request, "group_index", None),
        retries=request.retries or 0, chord=request.chord,
        callbacks=request.callbacks, errbacks=request.errbacks,
        reply_to=request.reply_to, root_id=request.root_id, parent_id=request.parent_id,
        chain=request.chain, ignore_result=bool(getattr(request, "ignore_result", False)),
        time_limit=(request.timelimit or (None, None))[0],
        soft_time_limit=(request.timelimit or (None, None))[1],
    )
    headers = dict(headers)
    headers.update(wait.on(getattr(request, "headers", None)))
    content_type, encoding, data = dumps(body, serializer=task.serializer
                                         or task.app.conf.task_serializer)
    if isinstance(data, str):
        data = data.encode(encoding or "utf-8")
    info = request.delivery_info or {}
    priority = info.get("priority")
    kept = {name: value for name, value in properties.items() if value}
    if isinstance(priority, int) and not isinstance(priority, bool):
        kept["priority"] = priority
    line = line_name(ref.key, ref.sub)
    return ParkedCopy(key=line, queue=parking_queue(line), body=bytes(data),
                      content_type=content_type, content_encoding=encoding,
                      headers=headers, properties=kept,
                      route=Route(str(info.get("exchange") or ""),
                                  str(info.get("routing_key") or "")),
                      attempt=request.retries or 0)


def park_here(task: Any, request: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
              ref: ParkRef, wait: WaitingRun) -> bool:
    """Publish the run's parked copy on this process's mover and wait (at most
    :data:`PUBLISH_TIMEOUT`) until it is in its parking queue. False: it is not."""
    copy = copy_of_request(task, request, args, kwargs, ref, wait)
    done = threading.Event()
    ended: List[Any] = []

    def on_done(result: Any) -> None:
        ended.append(result)
        done.set()

    if not mover(task.app).park(copy, on_done):
        return False
    return done.wait(PUBLISH_TIMEOUT) and bool(ended) and bool(ended[0].ok)


def sent(client: Any, ref: ParkRef, request: Any) -> None:
    """Confirm to the lock store that the parked copy of ``request``'s run is in its
    parking queue (:func:`~..engine.parking.copy_sent`), so that its reference does not
    lapse. A store that does not answer is not asked again: the reference then lapses
    after :data:`UNSENT_MS`, and is still known to the copy when it comes, which counts
    it again. A rate limit's line asks for no confirmation."""
    if is_rate_key(ref.key):
        return
    try:
        store.copy_sent(client, ref, store.run_id(request.id, request.retries or 0))
    except RedisError as exc:
        logger.debug("celery-redislock: task %s: its parked copy's publish was not "
                     "confirmed to the lock store: %r", request.id, exc)
