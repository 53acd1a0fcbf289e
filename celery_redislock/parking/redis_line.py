"""The parking line on a Redis broker: every step one Lua script on the broker's Redis.

kombu's Redis transport keeps a queue as a list named by the queue (one list per
priority step: ``<queue>\\x06\\x16<step>``), publishes with ``LPUSH`` and consumes with
``BRPOP`` (the right end). A parking queue is one list (no priority steps: the lock
store orders the line) that no worker's ``BRPOP`` names, holding kombu's own JSON
payloads, so the moved message is exactly what kombu would have delivered:

* park (``lua/park.lua``): ``LPUSH`` the copy, ``HSET`` the registry hash
  ``redislock.parking`` (queue -> semaphore key), once per job id;
* move (``lua/move.lua``): ``RPOP`` the oldest, read its target from the payload's
  first field ``redislock_to`` (``"<priority step> <queue>"``, written when parked: the
  queue found from the original's exchange and routing key as kombu routes, or given;
  read with a pattern, not by decoding the message), ``RPUSH`` it on the queue's list
  for that step as kombu's ``_put`` names it (the end ``BRPOP`` takes next), once per
  job id. kombu ignores the extra fields when it delivers the message. A parked
  message moves once: the id its moved copy carries (``move`` in its wait header, see
  :func:`.parked_copy.stamped`) is written when it is parked, also as the payload's
  second field ``redislock_move``.
  Moved, the message has the original's ``delivery_info`` (exchange, routing key), a new
  delivery tag, and is never in kombu's unacked hash while it moves;
* the moved copy's backup: kombu's ``BRPOP`` takes a message off its list before the
  consumer records it in the ``unacked`` hash, and a worker killed in between loses it
  (Celery alone meets that window once per message; a parked run meets it again with its
  moved copy). So move.lua also keeps the message as it moved, in a hash
  ``redislock.parking.moved.<move id>`` (its parking list and target, the message; 7 days
  at most) indexed in the sorted set ``redislock.parking.moving`` by when it is due
  (:data:`RESTORE_AFTER_MS` later, the broker's clock). A worker that receives the copy
  (kombu holds it from then on) drops the backup (``lua/claimed.lua``,
  :meth:`RedisParking.claimed`). The workers' polls put back the backups due
  (``lua/restore.lua``, :meth:`RedisParking.restore`) whose copy is no longer in the
  queue it was moved to (one still there is late, not lost: looked for again a second
  later) and not in kombu's ``unacked`` hash (a copy received whose claim is late),
  at the right end of their parking list, where the copy was: it keeps its
  place. Each backup is taken whole by one script or the other: claimed or put back,
  never both. The message put back carries a copy id of its own (its move id and an
  ``r``), so that should the copy taken off its queue come back after all (kombu giving
  back a received copy whose claim never reached the broker), the lock store's
  reference ends whichever of the two asks second. The backup is the broker's own
  message, as kombu's ``unacked`` hash holds one: it goes back to a parking queue, never
  to a task queue, and is never decoded here;
* lengths: ``LLEN``; registry (``lua/registry.lua``): the hash's queues that hold
  messages, the others removed from it (a queue parked into again is registered again
  in the same step), so that it holds the lines waiting now, not every key ever parked.

A job's marker (``redislock.parking.done.<job id>``, 10 minutes) makes a park or move
retried after a lost connection (by the mover, or by redis-py's own retry) happen once:
the retry reports what the first did. Keys take the transport's ``global_keyprefix``.
"""

from __future__ import annotations

import time
import uuid
from importlib import resources
from typing import Any, Dict, Iterable, List, Tuple

import redis
from kombu.utils.json import dumps

from .broker import Outcome, Restored
from .naming import (
    CONSUMED,
    DONE_PREFIX,
    MOVED_PREFIX,
    MOVING,
    REGISTRY,
    ROUTE_HEADER,
    UNROUTABLE,
    WAIT_HEADER,
)
from .parked_copy import ParkedCopy, stamped

#: The payload's first field: ``"<priority step> <queue>"``, where move.lua sends it.
TARGET_FIELD = "redislock_to"

#: The payload's second field: the moved copy's id, naming its backup.
MOVE_FIELD = "redislock_move"

#: How long a job's marker lives (s): longer than any retry of the job.
MARKER_LIFE = 600

#: How long (ms, the broker's clock) a moved message's backup waits for a worker to
#: receive its copy before it is put back in its parking queue (when the copy is no
#: longer in its queue): less than the lock store's reservation for it
#: (``engine.parking.RESERVE_MS``, 10 s), so that the slot handed over again when that
#: lapses moves the message put back.
RESTORE_AFTER_MS = 8000

#: When (ms after its move) a backup not yet claimed is first looked at: a copy still
#: in its queue then is late (the workers are busy), and the poll keeps its reservation
#: from then on, well before that lapses.
FIRST_LOOK_MS = 2000

#: How long a backup lives at most (s): the polls put it back long before.
BACKUP_LIFE = 7 * 24 * 3600

#: How many backups one poll puts back at most.
RESTORE_BATCH = 100

#: How far (entries) from its queue's right end a due backup's copy is looked for: one
#: still there is late (the workers are busy), not lost, and is not put back. In a
#: longer queue it is not looked for and counts as still there (put back, if lost, once
#: the queue is shorter): each look costs at most this many entries.
QUEUED_DEPTH = 1000

#: When (ms) a copy found still in its queue is looked for again (its reservation is
#: kept ``engine.late.KEEP_MS`` from each look).
RECHECK_MS = 2000

#: How long (ms, the broker's clock) a queue counts as consumed after a worker's poll
#: named it among its worker's queues (each poll does so once a second): a late copy
#: keeps its reservation only in a queue some running worker consumes.
CONSUMED_MS = 10_000

#: How long the queues bound to an exchange and routing key are remembered (s).
ROUTE_MEMORY = 30.0


def _script(name: str) -> str:
    return resources.files(__package__).joinpath("lua", name).read_text("utf-8")


class RedisParking:
    """:class:`~.broker.ParkingBroker` on kombu ``connection`` to a Redis broker (its
    own pool: a plain redis-py client on the transport's connection parameters)."""

    def __init__(self, connection: Any) -> None:
        self.channel = connection.default_channel
        self.prefix: str = self.channel.global_keyprefix or ""
        self.client = redis.Redis(connection_pool=self.channel.pool)
        self._park = self.client.register_script(_script("park.lua"))
        self._move = self.client.register_script(_script("move.lua"))
        self._registry = self.client.register_script(_script("registry.lua"))
        self._claimed = self.client.register_script(_script("claimed.lua"))
        self._restore = self.client.register_script(_script("restore.lua"))
        self._routes: Dict[Tuple[str, str], Tuple[float, List[str]]] = {}

    def park(self, copy: ParkedCopy, job_id: str) -> Outcome:
        payload = self.payload(copy)
        reply = self._park(keys=[self.prefix + copy.queue, self.prefix + REGISTRY,
                                 self.prefix + DONE_PREFIX + job_id],
                           args=[dumps(payload), copy.key, copy.queue, MARKER_LIFE])
        return Outcome(True, "parked before" if int(reply) < 0 else "parked")

    def move(self, queue: str, job_id: str) -> Outcome:
        reply = self._move(keys=[self.prefix + queue, self.prefix + DONE_PREFIX + job_id,
                                 self.prefix + UNROUTABLE, self.prefix + MOVING,
                                 self.prefix + REGISTRY],
                           args=[self.prefix, self.channel.sep, MARKER_LIFE,
                                 self.prefix + MOVED_PREFIX,
                                 min(FIRST_LOOK_MS, RESTORE_AFTER_MS), BACKUP_LIFE, queue])
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        again = text.startswith("again ")
        what, _, target = text.removeprefix("again ").partition(" ")
        if target and self.prefix:
            target = target.removeprefix(self.prefix)
        return Outcome(what == "moved", what + (" before" if again else ""), target)

    def claimed(self, move: str) -> bool:
        """A worker received the moved copy ``move`` (its move id): its backup is
        dropped. False: there was none (put back already, or never written)."""
        return bool(self._claimed(keys=[self.prefix + MOVING,
                                        self.prefix + MOVED_PREFIX + move], args=[move]))

    def restore(self, limit: int = RESTORE_BATCH, consumed: Iterable[str] = ()) -> Restored:
        """Put back the moved messages whose copies no worker received in time, each at
        the front of its parking queue, and say which copies are still in their queue
        (those in a queue some running worker consumes: ``consumed``, this caller's
        worker's queues, counts as such for :data:`CONSUMED_MS`)."""
        put_back, late, due, presumed = self._restore(
            keys=[self.prefix + MOVING, self.prefix + REGISTRY,
                  self.prefix + self.channel.unacked_key, self.prefix + CONSUMED],
            args=[self.prefix + MOVED_PREFIX, limit, QUEUED_DEPTH, RECHECK_MS,
                  RESTORE_AFTER_MS, CONSUMED_MS, self.channel.sep,
                  *(self.prefix + queue for queue in consumed)])
        return Restored([(_text(put_back[i]), _text(put_back[i + 1]).removeprefix(self.prefix))
                         for i in range(0, len(put_back), 2)], _pairs(late), int(due),
                        _pairs(presumed))

    def lengths(self, queues: Iterable[str]) -> Dict[str, int]:
        names = list(queues)
        with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.llen(self.prefix + name)
            return {name: int(n) for name, n in zip(names, pipe.execute())}

    def registry(self, max_age: float = 0.0) -> Dict[str, str]:  # always read now
        found = self._registry(keys=[self.prefix + REGISTRY], args=[self.prefix])
        return {_text(found[i]): _text(found[i + 1]) for i in range(0, len(found), 2)}

    def payload(self, copy: ParkedCopy) -> Dict[str, Any]:
        """kombu's JSON payload of ``copy``, as its Redis transport would have pushed
        the original (body encoded, a new delivery tag, the original's delivery_info),
        with the route header naming its target list."""
        body, encoding = self.channel.encode_body(copy.body, self.channel.body_encoding)
        route = copy.route
        queue = route.queue or self.queue_of(route.exchange, route.routing_key)
        properties = {**copy.properties, "body_encoding": encoding,
                      "delivery_tag": str(uuid.uuid4()),
                      "delivery_info": {"exchange": route.exchange,
                                        "routing_key": route.routing_key}}
        step = self.channel.priority(self.channel._get_message_priority(
            {"properties": properties}, reverse=False))
        move = uuid.uuid4().hex[:16]
        headers = stamped(copy.headers, move)
        named = isinstance(headers.get(WAIT_HEADER), dict)  # the copy can claim its backup
        return {  # the target first: move.lua reads it without decoding the message
            TARGET_FIELD: f"{step} {queue}", **({MOVE_FIELD: move} if named else {}),
            "body": body, "content-encoding": copy.content_encoding,
            "content-type": copy.content_type,
            "headers": {**headers, ROUTE_HEADER: copy.route_header(queue=queue)},
            "properties": properties}

    def queue_of(self, exchange: str, routing_key: str) -> str:
        """The queue kombu routes ``exchange``/``routing_key`` to (the first, sorted, when
        the exchange routes it to several: the copy goes back to one queue only)."""
        if not exchange:
            return routing_key
        now = time.monotonic()
        known = self._routes.get((exchange, routing_key))
        if known is None or known[0] < now:
            table = self.channel.get_table(exchange)
            found = self.channel.typeof(exchange).lookup(table, exchange, routing_key, None)
            known = (now + ROUTE_MEMORY, sorted(q for q in found if q))
            self._routes[(exchange, routing_key)] = known
        if not known[1]:
            raise LookupError(f"no queue is bound to exchange {exchange!r} with "
                              f"routing key {routing_key!r}")
        return known[1][0]


def _pairs(flat: List[Any]) -> List[Tuple[str, str]]:
    """``[a, b, c, d]`` as ``[(a, b), (c, d)]``, decoded."""
    return [(_text(flat[i]), _text(flat[i + 1])) for i in range(0, len(flat), 2)]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
