"""The mover: one thread per worker process that parks and moves, in order, on its
own broker connection (kombu's API blocks; the event loop must not).

    >>> from kombu import Connection
    >>> mover = Mover(lambda: Connection(redis_url)).start()
    >>> done = []
    >>> mover.move(parking_queue("redislock:{k}:s:x"), done.append)
    True
    >>> mover.stop()
    True
    >>> done[0].outcome
    Outcome(done=False, what='empty', target='', doubt=False)

Submission (:meth:`Mover.park`, :meth:`Mover.move`, :meth:`Mover.claim`) is thread-safe
and never waits: it returns False when the bounded queue of jobs is full or the mover
stopped, and the caller keeps the run (the original unacknowledged, or the reservation
given back; a claim not taken leaves the backup to be put back). Each
job ends with exactly one call of its ``on_done(Done)`` on the mover's thread (the
worker's main process passes ``LoopHop(hub).on_loop(callback)``, see :mod:`.hop`, which
runs the callback at the event loop's next turn).

A connection error retries the job on a new connection (every ``retry_delay`` seconds
until :meth:`Mover.stop` gives up on it): on a Redis broker a retried job happens once
(its job id's marker, see :mod:`.redis_line`); on RabbitMQ a park retried after its
publish was sent reports ``doubt`` (two copies may exist: the reference makes the second
stale), and a move whose publish was sent is not retried (``doubt``; if it did not
reach the broker, the parked message went back to its queue and the lock store's
reservation lapses, to be handed over again). Any other error ends the job with
``Done.error``, not retried.
"""

from __future__ import annotations

import logging
import queue as queues
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kombu.exceptions import OperationalError

from .broker import Outcome, ParkingBroker
from .naming import parking_queue  # noqa: F401  (the doctest's)
from .parked_copy import ParkedCopy
from .transport import broker_for

logger = logging.getLogger(__name__)


class Cancelled(Exception):
    """The mover stopped before the job could be done."""


@dataclass(frozen=True)
class Done:
    """How a job ended: ``outcome`` (None when it was not done: ``error`` says why),
    after ``attempts`` tries."""

    kind: str                       # "park", "move" or "claim"
    job_id: str
    queue: str                      # the parking queue
    outcome: Optional[Outcome]
    error: Optional[BaseException] = None
    attempts: int = 1
    copy: Optional[ParkedCopy] = None

    @property
    def ok(self) -> bool:
        """The job did what it was for: the copy parked, or one message moved."""
        return self.outcome is not None and self.outcome.done


OnDone = Callable[[Done], None]


@dataclass(frozen=True)
class _Job:
    kind: str
    queue: str
    on_done: OnDone
    copy: Optional[ParkedCopy] = None
    job_id: str = ""


_STOP = object()

#: How long (s) the mover's AMQP connection waits for a read, a write or a confirm.
SOCKET_TIMEOUT = 30.0


class Mover:
    """Parks and moves on a thread of its own; ``connect()`` returns a new kombu
    connection (see :meth:`for_app`)."""

    def __init__(self, connect: Callable[[], Any], max_jobs: int = 10_000,
                 retry_delay: float = 0.5, name: str = "redislock-mover",
                 broker: Callable[[Any], ParkingBroker] = broker_for) -> None:
        self._connect = connect
        self._broker_of = broker
        self._max_jobs = max_jobs
        self._jobs: queues.Queue[Any] = queues.Queue(max_jobs + 1)  # + the stop
        self._retry_delay = retry_delay
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._abandon = threading.Event()
        self._lock = threading.Lock()
        self._connection: Any = None
        self._broker: Optional[ParkingBroker] = None

    @classmethod
    def for_app(cls, app: Any, **options: Any) -> Mover:
        """A mover on ``app``'s broker (``app.connection_for_write()``; on an AMQP broker
        with publisher confirms, and reads and writes that give up after
        :data:`SOCKET_TIMEOUT` s, so that a half-open connection fails the job instead of
        hanging the thread: the job is then tried again on a new connection)."""
        return cls(lambda: app.connection_for_write(transport_options={
            "confirm_publish": True, "read_timeout": SOCKET_TIMEOUT,
            "write_timeout": SOCKET_TIMEOUT}), **options)

    def start(self) -> Mover:
        self._thread.start()
        return self

    @property
    def pending(self) -> int:
        """Jobs submitted and not yet done (about: others may submit meanwhile)."""
        return self._jobs.qsize()

    def park(self, copy: ParkedCopy, on_done: OnDone) -> bool:
        """Publish ``copy`` into its parking queue; False: not taken (full or stopped)."""
        return self._submit(_Job("park", copy.queue, on_done, copy, uuid.uuid4().hex))

    def move(self, queue: str, on_done: OnDone) -> bool:
        """Move one message of parking queue ``queue`` back; False: not taken."""
        return self._submit(_Job("move", queue, on_done, None, uuid.uuid4().hex))

    def claim(self, move: str, on_done: OnDone) -> bool:
        """A moved copy ``move`` (its move id) was received here: drop its backup
        (see :mod:`.redis_line`); False: not taken (its backup is put back later, and
        the lock store's reference ends that copy)."""
        return self._submit(_Job("claim", "", on_done, None, move))

    def _submit(self, job: Any) -> bool:
        with self._lock:
            if self._closed or self._jobs.qsize() >= self._max_jobs:
                return False
            self._jobs.put_nowait(job)
            return True

    def stop(self, timeout: float = 10.0) -> bool:
        """Take no more jobs, finish those taken, and end the thread; after ``timeout``
        seconds, jobs still waiting on the broker end with :class:`Cancelled`. True when
        the thread ended."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._jobs.put_nowait(_STOP)  # room is kept for it (see _submit)
        if not self._thread.is_alive():
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandon.set()
            self._thread.join(max(1.0, self._retry_delay * 2))
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                self._report(job, self._do(job))
        finally:
            self._disconnect()

    def _do(self, job: _Job) -> Done:
        attempts, doubt = 0, False
        while True:
            attempts += 1
            if self._abandon.is_set():
                return Done(job.kind, job.job_id, job.queue, None, Cancelled(), attempts,
                            job.copy)
            try:
                broker = self._ensure()
                outcome = self._step(broker, job)
            except self._recoverable() as exc:
                uncertain = bool(getattr(self._broker, "sent", False))
                self._disconnect()
                if uncertain and job.kind == "move":
                    return Done(job.kind, job.job_id, job.queue,
                                Outcome(True, "moved", doubt=True), exc, attempts)
                doubt = doubt or uncertain
                logger.warning("redislock: the parking line's %s on %s failed (%r); "
                               "trying again", job.kind, job.queue, exc)
                self._abandon.wait(self._retry_delay)
                continue
            except Exception as exc:
                self._disconnect()
                return Done(job.kind, job.job_id, job.queue, None, exc, attempts, job.copy)
            if doubt:
                outcome = Outcome(outcome.done, outcome.what, outcome.target, True)
            return Done(job.kind, job.job_id, job.queue, outcome, None, attempts, job.copy)

    @staticmethod
    def _step(broker: ParkingBroker, job: _Job) -> Outcome:
        if job.kind == "park":
            assert job.copy is not None
            return broker.park(job.copy, job.job_id)
        if job.kind == "claim":  # at most once more when retried: a claim is idempotent
            return Outcome(broker.claimed(job.job_id), "claimed")
        return broker.move(job.queue, job.job_id)

    def _recoverable(self) -> tuple:  # type: ignore[type-arg]
        errors = getattr(self._connection, "connection_errors", ())
        return (OSError, OperationalError, *errors)

    def _ensure(self) -> ParkingBroker:
        if self._broker is None:
            self._connection = self._connect()
            self._connection.ensure_connection(max_retries=1, interval_start=0,
                                               interval_step=0, interval_max=0)
            self._broker = self._broker_of(self._connection)
        return self._broker

    def _disconnect(self) -> None:
        connection, self._connection, self._broker = self._connection, None, None
        if connection is not None:
            try:
                connection.collect()
            except Exception:
                logger.debug("redislock: closing the mover's connection", exc_info=True)

    @staticmethod
    def _report(job: _Job, done: Done) -> None:
        try:
            job.on_done(done)
        except Exception:
            logger.exception("redislock: the parking line's callback failed for %s",
                             job.kind)
