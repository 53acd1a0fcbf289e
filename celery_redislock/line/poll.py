"""The parking line's poll: a thread of each worker's main process that asks the lock
store every :data:`POLL` seconds for slots freed without a release (a lease ran out, a
reservation lapsed, a pause or the grace ended: ``due``) and the rate lines' starts now
due, and hands the moves owed to this process's mover (:func:`.moves.owe`). Every
:data:`RESTORE_EVERY` seconds a poll first puts back in their parking queues the moved
messages whose copies no worker received in time (Redis broker:
:meth:`~celery_redislock.parking.RedisParking.restore`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, List, Sequence, Tuple

import redis
from celery.apps.worker import Worker as CommandWorker
from celery.bootsteps import CLOSE, RUN, TERMINATE
from celery.signals import worker_init, worker_process_shutdown, worker_ready, worker_shutdown

from ..config.settings import read_settings, redis_client
from ..engine import parking as store
from ..engine import parking_rate
from ..engine.admission import ParkedMove
from ..engine.late import keep_late
from ..errors import LockConfigurationError
from ..parking import broker_for, key_of_line, parked_lengths, recount
from ..parking.redis_line import RESTORE_BATCH
from . import moves

logger = logging.getLogger(__name__)


#: How often (s) each worker's main process asks the lock store for moves owed.
POLL = 0.2

#: How many keys with a parked line the poll visits per :data:`POLL` seconds, at most:
#: a poll over more waits longer before the next (:func:`pause_after`), so that the
#: lock store's and the broker's work while lines are parked stays bounded whatever the
#: number of keys (each key visited costs about 12 commands in the store, 2 in the
#: broker). Rate limits' lines are asked every :data:`POLL` s whatever the number of
#: keys: their runs start when the poll finds their promised start due.
POLL_KEYS = 100

#: How often (s) each worker's poll puts back the moved messages no worker received in
#: time: one broker script; a backup is due 8 s after its move, so that it is back
#: before the move's reservation lapses (10 s).
RESTORE_EVERY = 1.0

#: How many rounds of backups due one poll looks at, at most (each one broker script).
RESTORE_ROUNDS = 50


def pause_after(keys: int) -> float:
    """How long (s) the poll waits before visiting the slots' lines of ``keys`` keys
    again: :data:`POLL` up to :data:`POLL_KEYS` keys, then in proportion (a slot freed
    without a release is handed over after up to that long).

        >>> pause_after(1), pause_after(100), pause_after(10_000)
        (0.2, 0.2, 20.0)
    """
    return max(POLL, POLL * keys / POLL_KEYS)


class Poll:
    """A thread of the worker's main process: every :data:`POLL` s, the moves owed for
    slots freed without a release (``due``), over the keys the lock store's index and
    the broker's registry of parking queues know (over more than :data:`POLL_KEYS`
    keys, every :func:`pause_after` s; the rate limits' lines in between). ``worker``:
    an embedded worker whose end ends the poll (it may never send ``worker_shutdown``);
    None: until stopped."""

    def __init__(self, app: Any, worker: Any = None) -> None:
        self.app = app
        self.worker = worker
        #: When (``time.monotonic()``) the next poll visits every line, not only rates'.
        self.next_visit = 0.0
        #: When (``time.monotonic()``) the next poll puts back unclaimed moved messages.
        self.next_restore = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redislock-poll", daemon=True)

    def start(self) -> Poll:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        connection = None
        while not self._stop.wait(POLL) and not _ended(self.worker):
            if not _running(self.worker):  # not started (or refused to start): no poll
                continue
            try:
                if connection is None:
                    connection = self.app.connection_for_write()
                self.once(broker_for(connection))
            except Exception as exc:
                logger.debug("celery-redislock: the parking line's poll failed: %r", exc)
                if connection is not None:
                    connection.collect()
                connection = None
        if connection is not None:
            connection.collect()

    def once(self, broker: Any) -> List[ParkedMove]:
        """One poll: the moves owed now, handed to the mover (before :attr:`next_visit`,
        only the rate limits' lines)."""
        settings = read_settings(self.app)  # as the app's runs read it (not at start)
        client, prefix = redis_client(self.app, settings), settings.prefix
        if time.monotonic() >= self.next_restore:
            self.next_restore = time.monotonic() + RESTORE_EVERY
            restore(broker, client, consumed_queues(self.app))
        if time.monotonic() < self.next_visit:
            return self._rates_only(broker, client, prefix)
        counted = recount(broker)
        moves.note_sub_lines(counted)
        lengths = by_key(counted, prefix)
        indexed = set(store.parked_keys(client, prefix)) - set(lengths)
        indexed |= set(parking_rate.rate_parked_keys(client, prefix)) - set(lengths)
        lengths.update(parked_lengths(broker, indexed))
        rates = {key: n for key, n in lengths.items() if parking_rate.is_rate_key(key)}
        slots = {key: n for key, n in lengths.items() if key not in rates}
        owed = store.due(client, slots, prefix=prefix) if slots else []
        if rates:  # rate limits' lines: the copies whose promised start is due
            owed += parking_rate.due_rate(client, rates, prefix=prefix)
        self.next_visit = time.monotonic() + pause_after(len(slots)) - POLL
        moves.owe(self.app, owed)
        return owed

    def _rates_only(self, broker: Any, client: Any, prefix: str) -> List[ParkedMove]:
        """A poll between two visits of every line: the rate limits' lines only."""
        keys = parking_rate.rate_parked_keys(client, prefix)
        owed = parking_rate.due_rate(client, parked_lengths(broker, keys), prefix=prefix) \
            if keys else []
        moves.owe(self.app, owed)
        return owed


def restore(broker: Any, client: Any, consumed: Sequence[str] = ()) -> None:
    """Put back the moved messages no worker received in time (logged: each is a copy
    lost in kombu's pop window), in rounds of the broker's batch while rounds come full
    (:data:`RESTORE_ROUNDS` at most), and keep the reservations of the copies still in
    their queue (late, not lost: :func:`~celery_redislock.engine.late.keep_late`), in a
    queue some running worker consumes (``consumed``: this worker's queues)."""
    late: List[Tuple[str, str]] = []
    presumed: List[Tuple[str, str]] = []
    for _ in range(RESTORE_ROUNDS):
        found = broker.restore(consumed=consumed)
        for move, queue in found.put_back:
            log_put_back(move, queue)
        late += [(key_of_line(line), move) for move, line in found.late]
        presumed += [(key_of_line(line), move) for move, line in found.presumed]
        if found.due < RESTORE_BATCH:
            break
    if late or presumed:
        try:
            keep_late(client, late, presumed)
        except redis.RedisError as exc:  # e.g. a refused command: the moves go on
            logger.warning("celery-redislock: the late moved copies' reservations were not "
                           "kept (they lapse as any reservation): %r", exc)


def log_put_back(move: str, queue: str) -> None:
    """Log one moved copy put back by :func:`restore`: ``move``, the new move id of its
    message, back at the front of its parking ``queue`` (a copy lost in kombu's pop
    window). Called once per put-back, where it happens: the one place that sees each."""
    logger.warning("celery-redislock: a moved copy (%s) was not received in time; "
                   "its message is back at the front of %s", move, queue)


def consumed_queues(app: Any) -> List[str]:
    """The queues this worker consumes (its ``-Q``, and any added since; all the app's
    queues if it named none)."""
    return sorted(app.amqp.queues.consume_from)


def by_key(lines: Dict[str, int], prefix: str) -> Dict[str, int]:
    """The messages parked per semaphore key under ``prefix``, from those per line (a
    fair line's sub-lines summed: the store counts the line as a whole).

        >>> by_key({"p:k": 1, "p:k\x1fa": 2, "p:j\x1fb": 3, "q:k": 4}, "p:")
        {'p:k': 3, 'p:j': 3}
    """
    lengths: Dict[str, int] = {}
    for line, n in lines.items():
        key = key_of_line(line)
        if key.startswith(prefix):
            lengths[key] = lengths.get(key, 0) + n
    return lengths


_polls: Dict[int, Poll] = {}


def _ended(worker: Any) -> bool:
    """Whether embedded ``worker`` (None: none) has stopped or is stopping."""
    blueprint = getattr(worker, "blueprint", None)
    return blueprint is not None and blueprint.state in (CLOSE, TERMINATE)


def _running(worker: Any) -> bool:
    """Whether embedded ``worker`` runs (None: the command's worker, which does)."""
    return worker is None or getattr(getattr(worker, "blueprint", None), "state", None) == RUN


@worker_ready.connect
def _start_poll(sender: Any = None, worker: Any = None, **_: Any) -> None:
    """Start this process's poll for ``sender``'s app (``worker``: an embedded worker,
    whose poll replaces an earlier embedded worker's and ends with it)."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    found = _polls.get(os.getpid())
    if found is not None:
        if found.worker is None or found.worker is worker:
            return
        found.stop()
    _polls[os.getpid()] = Poll(app, worker).start()


@worker_init.connect
def _start_poll_embedded(sender: Any = None, **_: Any) -> None:
    """A worker embedded in a process (``celery.contrib.testing``'s ``start_worker``, the
    ``celery_worker`` fixture, a ``WorkController`` made by hand) never sends
    ``worker_ready``, which only the ``celery worker`` command's worker does: without
    this, nothing there would hand over slots freed without a release, nor give up a
    parked run past its ``lock_max_wait``."""
    if sender is None or isinstance(sender, CommandWorker):
        return
    try:
        _start_poll(sender, worker=sender)
    except LockConfigurationError:  # the worker's start check says so
        return


@worker_shutdown.connect
@worker_process_shutdown.connect
def _stop(**_: Any) -> None:
    poll = _polls.pop(os.getpid(), None)
    if poll is not None:
        poll.stop()
    moves.stop_movers()
