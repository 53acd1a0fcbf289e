"""The Celery app the history check's workers run: one task per kind and ack mode.

The workers start it with ``celery -A history.app worker``; the URLs come from the
environment (:class:`worker_app.AppUrls`: broker, result backend, lock store, recorder).
Every body records its ``start`` (the lease's fence and the start its admission counted,
``admitted_ms`` on the lock store's clock; whether its message came back from the broker
unacknowledged, and whether it is a copy the package sent) and its ``end``; the ``lock_acquired``,
``lock_released``, ``lease_lost``, ``lock_contended`` and ``rate_limited`` signals are
recorded too, each where it is sent. Each delivery a worker's main process receives is
recorded (``received``: Celery's ``task_received``, with the worker, its pid, whether
the broker redelivered it, and a moved copy's ``move`` id), and so is its acceptance by
a pool process (``accepted``, just before Celery acknowledges a default-acks run). On a
Redis broker every move of a parked message (``moved``: its parking queue, what the
move did) and every moved message put back in its parking queue because no worker
received its copy (``restored``: its new move id, its parking queue) are recorded where
they happen. Every renewal of a run's lease (``renewal``: its key, fence and holder
token, the lease's length, when it was sent and answered, and what came of it: renewed,
lost, or an error) is recorded by the process that renews it, after its answer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any, Dict, Optional

from celery import Celery
from celery import signals as celery_signals

from celery_redislock import LimitedTask
from celery_redislock.engine.admission import Lease
from celery_redislock.gate.recovery import LimitedRequest
from celery_redislock.integration import signals
from celery_redislock.line import poll
from celery_redislock.parking import RedisParking
from celery_redislock.parking.naming import WAIT_HEADER

from .events import recorder
from .workload import KINDS, Kind
from worker_app import BROKER_URL_ENV, AppUrls

#: The broker's visibility timeout (s): an unacknowledged message of a worker killed
#: whole comes back after it. Countdowns stay below half of it.
VISIBILITY_TIMEOUT = 40

#: The Redis transport's options: kombu looks for messages to restore every 10 s and
#: scans on every 10th look (so about every 100 s), under a mutex that a worker killed
#: while holding it keeps for 300 s. Here every 2 s, under a mutex of 10 s, so that a
#: killed worker's unacknowledged messages come back soon after the visibility timeout.
TRANSPORT_OPTIONS = {"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_interval": 2,
                     "unacked_restore_throttle": 1, "unacked_mutex_expire": 10}

#: Short countdowns while a run waits, so that a run's backlog drains fast.
RETRY = {"lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.5}

#: The environment variable that gives the workers' app its ``redislock_line`` (unset:
#: the package's default).
LINE_ENV = "REDISLOCK_HISTORY_LINE"

#: The environment variable that gives the workers' app its ``redislock_gate`` (unset:
#: the package's default).
GATE_ENV = "REDISLOCK_HISTORY_GATE"

#: Loggers whose debug lines the workers' logs keep: the parked line's poll says there
#: why one of its rounds failed.
DEBUG_LOGGERS = ("celery_redislock.line.broker_line", "celery_redislock.line.moves",
                 "celery_redislock.line.poll")

SIGNALS = ("lock_acquired", "lock_released", "lease_lost", "lock_contended", "rate_limited")


def node(hostname: Optional[str]) -> str:
    """The worker's node name before the ``@`` (``worker1``)."""
    return (hostname or "").split("@", 1)[0]


#: The headers of a copy of a run's message that the package sends (a run sent back to
#: wait, handed a slot, or parked); the message a task was sent as carries none of them.
#: (The worker's main process adds other request fields, ``redislock_admitted``...)
COPY_HEADERS = ("redislock_wait", "redislock_park")


def is_copy(request: Any) -> bool:
    """Whether ``request`` (a task's) came from a copy the package sent. A message's
    headers are the request's fields; an admitted run's ``headers`` lose the wait
    header before the body starts, its field stays.

        >>> from celery.app.task import Context
        >>> is_copy(Context({"redislock_wait": {}})), is_copy(Context({"id": "x"}))
        (True, False)
    """
    headers = message_headers(request)
    return any(getattr(request, name, None) is not None
               or (headers is not None and name in headers) for name in COPY_HEADERS)


def message_headers(request: Any) -> Optional[Dict[str, Any]]:
    """The message headers of ``request``: a task's context's ``headers``, or the
    ``request_dict`` of a worker's ``Request`` (what ``task_received`` is sent), which
    has no ``headers``.

        >>> from celery.app.task import Context
        >>> message_headers(Context({"headers": {"a": 1}})), message_headers(None)
        ({'a': 1}, None)
    """
    for name in ("headers", "request_dict"):
        headers = getattr(request, name, None)
        if isinstance(headers, dict):
            return headers
    return None


def weight(cost: int) -> int:
    """A weighted run's cost: its ``cost`` argument."""
    return cost


def create_app(urls: AppUrls, line: Optional[str] = None,
               gate: Optional[str] = None) -> Celery:
    """The history app on ``urls``: every kind's two tasks, and the signals recorded;
    ``redislock_line`` is ``line`` and ``redislock_gate`` is ``gate`` when given (else
    the package's defaults)."""
    app = Celery("history", broker=urls.broker, backend=urls.backend, set_as_current=False)
    if line:
        app.conf.redislock_line = line
    if gate:
        app.conf.redislock_gate = gate
    app.conf.update(
        redislock_url=urls.lock,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=TRANSPORT_OPTIONS,
        result_backend_transport_options={"retry_policy": {"max_retries": 3}},
    )
    request = request_class(urls)
    for kind in KINDS:
        for acks_late in (True, False):
            _define(app, urls, kind, acks_late, request)
    _record_signals(app, urls)
    _record_receipts(app, urls)
    _record_ends_unrun(urls)
    _record_moves(urls)
    _record_renewals(urls)
    return app


def request_class(urls: AppUrls) -> type:
    """The tasks' request class: the package's, recording ``accepted`` (task, worker,
    pid) when a pool process accepts the run, before Celery acknowledges it there (a
    default-acks run)."""
    class HistoryRequest(LimitedRequest):
        def on_accepted(self, pid: Any, time_accepted: Any) -> None:
            recorder(urls.record).event("accepted", task=self.id, worker=node(self.hostname),
                                        pid=os.getpid(), child=pid)
            super().on_accepted(pid, time_accepted)
    return HistoryRequest


def _define(app: Celery, urls: AppUrls, kind: Kind, acks_late: bool,
            request: Optional[type] = None) -> None:
    limits: Any = {"lock_key": kind.key, "lock_lease": kind.lease}
    if kind.slots is not None:
        limits["lock_slots"] = kind.slots
    if kind.rate is not None:
        count, period = kind.rate
        limits.update(lock_rate=f"{count}/{period:g}s", lock_burst=kind.burst)
    if kind.costs != (1, 1):
        limits["lock_cost"] = weight

    def body(self: Any, key: int, seconds: float, cost: int = 1) -> str:
        request = self.request
        lease = getattr(request, "redislock_lease", None)
        run = uuid.uuid4().hex
        record = recorder(urls.record)
        record.started(run, os.getpid(), node(request.hostname), task=request.id,
                       fence=str(getattr(lease, "fence", "")),
                       token=str(getattr(lease, "token", "") if lease is not None else ""),
                       admitted_ms=str(getattr(lease, "acquired_at_ms", "")),
                       redelivered=bool((request.delivery_info or {}).get("redelivered")),
                       copy=is_copy(request))
        try:
            time.sleep(seconds)  # the body's work
        finally:
            record.ended(run, task=request.id, lost=bool(getattr(lease, "lost", False)))
        return run

    if request is not None:
        limits["Request"] = request
    app.task(base=LimitedTask, bind=True, shared=False, name=kind.task_name(acks_late),
             acks_late=acks_late, reject_on_worker_lost=acks_late, **RETRY, **limits)(body)


def _record_signals(app: Celery, urls: AppUrls) -> None:
    def receiver(name: str) -> Any:
        def receive(sender: Any = None, task_id: Optional[str] = None, **kwargs: Any) -> None:
            if getattr(sender, "app", None) is not app or not task_id:
                return
            lease = kwargs.get("lease")
            recorder(urls.record).event(
                name, task=task_id, pid=os.getpid(), fence=str(getattr(lease, "fence", "")),
                key=str(kwargs.get("key") or getattr(lease, "name", "")))
        return receive

    for name in SIGNALS:
        getattr(signals, name).connect(receiver(name), weak=False)


def _record_receipts(app: Celery, urls: AppUrls) -> None:
    """Record every delivery of ``app``'s tasks that a worker's main process receives
    (``task_received``: the message is in the broker's ``unacked`` hash by then)."""
    def receive(sender: Any = None, request: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app or request is None:
            return
        delivery = getattr(request, "delivery_info", None) or {}
        recorder(urls.record).event(
            "received", task=request.id, worker=node(getattr(request, "hostname", None)),
            pid=os.getpid(), redelivered=bool(delivery.get("redelivered")),
            copy=is_copy(request), move=move_of_request(request))

    celery_signals.task_received.connect(receive, weak=False)


def move_of(headers: Any) -> str:
    """The move id a moved copy's ``headers`` carry ("" for any other message).

        >>> move_of({"redislock_wait": {"move": "ab12"}}), move_of(None)
        ('ab12', '')
    """
    wait = headers.get(WAIT_HEADER) if isinstance(headers, dict) else None
    return str(wait.get("move") or "") if isinstance(wait, dict) else ""


def move_of_request(request: Any) -> str:
    """The move id of the delivery ``request`` (a worker's ``Request`` or a task's
    context): :func:`move_of` its message headers."""
    return move_of(message_headers(request))


def _record_moves(urls: AppUrls) -> None:
    """Record each move of a parked message and each message put back (Redis broker),
    where the worker's mover or poll does it: a put-back where the poll logs it
    (:func:`~celery_redislock.line.poll.log_put_back`, wrapped)."""
    if getattr(RedisParking, "_history_recorded", False):
        return
    parking_move, log_put_back = RedisParking.move, poll.log_put_back

    def moved(self: RedisParking, queue: str, job_id: str) -> Any:
        outcome = parking_move(self, queue, job_id)
        recorder(urls.record).event("moved", queue=queue, what=outcome.what, pid=os.getpid())
        return outcome

    def restored(move: str, queue: str) -> None:
        log_put_back(move, queue)
        recorder(urls.record).event("restored", move=move, queue=queue, pid=os.getpid())

    RedisParking.move = moved  # type: ignore[method-assign]
    poll.log_put_back = restored
    RedisParking._history_recorded = True  # type: ignore[attr-defined]


#: The outcomes of a renewal, as recorded.
RENEWED, LOST, ERROR = "renewed", "lost", "error"

_renewing = threading.local()


def _record_renewals(urls: AppUrls) -> None:
    """Record every renewal of a run's lease where it is made (the lease keeper's thread
    of the process that runs the body): ``Lease.renew`` wrapped, its result and errors
    passed on as they are. One event after the answer, whose ``t`` (the recorder's clock)
    comes after it: ``sent_ago_us`` and ``answered_ago_us`` say how long before that write the
    request was sent and its answer read (this process's monotonic clock), so
    ``t - answered_ago_us`` is never before the answer. A renewal whose record cannot be
    written is renewed all the same."""
    if getattr(Lease, "_history_recorded", False):
        return
    renew = Lease.renew

    def renewed(self: Lease) -> bool:
        if getattr(_renewing, "inside", False):  # a part of a lease being renewed
            return renew(self)
        _renewing.inside = True
        sent = time.monotonic()
        outcome, error = ERROR, ""
        try:
            result = renew(self)
            outcome = RENEWED if result else LOST
            return result
        except Exception as exc:
            error = type(exc).__name__
            raise
        finally:
            _renewing.inside = False
            answered = time.monotonic()
            _write_renewal(urls, self, outcome, error, sent, answered)

    Lease.renew = renewed  # type: ignore[method-assign]
    Lease._history_recorded = True  # type: ignore[attr-defined]


def _write_renewal(urls: AppUrls, lease: Lease, outcome: str, error: str, sent: float,
                   answered: float) -> None:
    now = time.monotonic()
    try:
        recorder(urls.record).event(
            "renewal", key=lease.name, fence=str(lease.fence), token=lease.token,
            lease_s=lease.lease_seconds, outcome=outcome, error=error, pid=os.getpid(),
            sent_ago_us=int((now - sent) * 1e6), answered_ago_us=int((now - answered) * 1e6))
    except Exception:  # the record is lost, never the renewal
        logging.getLogger(__name__).exception("history: a renewal was not recorded")


class _EndsUnrun(logging.Filter):
    """Records ``served`` (task, pid) when a run ends without running because another copy
    of its message ran it, which the package says only in a DEBUG line of its own: the
    logger is let through DEBUG for this, every other DEBUG line is dropped as before."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            return True
        fields = served_fields(record)
        if fields is not None:
            recorder(self.url).event("served", pid=os.getpid(), **fields)
        return False


def served_fields(record: logging.LogRecord) -> Optional[Dict[str, str]]:
    """The task and key of the package's DEBUG line that a run ends as served by another
    copy (``waiting.served``), or None for any other line."""
    args = record.args if isinstance(record.args, tuple) else ()
    if len(args) == 4 and args[2] == "served already":
        return {"task": str(args[1]), "key": str(args[3])}
    return None


def _record_ends_unrun(urls: AppUrls) -> None:
    log = logging.getLogger(ENDS_UNRUN_LOGGER)
    if not any(isinstance(f, _EndsUnrun) for f in log.filters):
        log.addFilter(_EndsUnrun(urls.record))
        log.setLevel(logging.DEBUG)


#: The package's logger that says when a run ends as served by another copy.
ENDS_UNRUN_LOGGER = "celery_redislock.line.waiting"


if BROKER_URL_ENV in os.environ:
    for _name in DEBUG_LOGGERS:
        logging.getLogger(_name).setLevel(logging.DEBUG)

#: The app of the worker processes, which find the URLs in their environment.
app: Optional[Celery] = (
    create_app(AppUrls.from_environment(), os.environ.get(LINE_ENV) or None,
               os.environ.get(GATE_ENV) or None)
    if BROKER_URL_ENV in os.environ else None
)
