"""What the tasks write down about each run, in Redis, and how it is read back.

Every run of a limited task, once it holds its slot, records:

* ``INCR running:<key>`` at its start and ``DECR`` at its end, where ``<key>`` is the name
  of the semaphore it holds; the value ``INCR`` returned (how many runs of that key were
  inside their bodies at that moment, this one included) is appended to ``levels:<key>``;
* its start and end times, from the Redis server's clock (``TIME``), in ``run:<task id>``;
* one more start of its task id in the hash ``starts``, to prove each task ran once;
* the time it was admitted (the lock store's clock, ms) in the sorted set ``admitted:<key>``;
* ``INCR ended:<key>`` at its end, so a live view can count the runs done so far.

Every delivery of a run to a worker (admitted, or refused and parked; Celery's
``task_received``) adds one to its count in the hash ``deliveries``; the first one also
writes the server's time in the hash ``asked``: when the run first asked for its slot,
from which its wait is measured.

All keys begin with a prefix (``PROJ_RECORD_PREFIX``), so several demo runs can share a
server without mixing up their records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence

import redis

DEFAULT_PREFIX = "proj-demo:"


@dataclass(frozen=True)
class Run:
    """One recorded run of a task: which semaphore it held and when, by the server's clock."""

    task_id: str
    limit_key: str
    slots: int
    start_us: int
    end_us: Optional[int]
    waits: int
    asked_us: Optional[int] = None
    admitted_ms: Optional[int] = None

    @property
    def wait_s(self) -> Optional[float]:
        """Seconds from the run's first ask for a slot to the start of its body."""
        return None if self.asked_us is None else (self.start_us - self.asked_us) / 1e6


class Progress(NamedTuple):
    """How far the runs of one limit key have got, as the tasks recorded it."""

    running: int
    started: int
    ended: int


class Recorder:
    """Reads and writes the run records under one key prefix of one Redis database.

    Example::

        recorder = Recorder(redis.Redis.from_url(url), prefix="proj-demo:")
        recorder.started(task_id, "customer:1", slots=1, waits=0)
        ...
        recorder.ended(task_id, "customer:1")
    """

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix

    def forget(self) -> int:
        """Delete every record key of this prefix (one run's): returns how many went."""
        removed = 0
        for key in list(self.client.scan_iter(match=self.prefix + "*", count=1000)):
            removed += self.client.delete(key)
        return removed

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _now_us(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    def delivered(self, task_id: str) -> None:
        """Record that a worker picked up a run of ``task_id`` (admitted or not); the first
        time, also when (on the server's clock)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby(self._key("deliveries"), task_id, 1)
        pipe.hsetnx(self._key("asked"), task_id, self._now_us())
        pipe.execute()

    def times_sent_back(self, task_id: str) -> int:
        """How many deliveries of ``task_id`` did not run it (it parked), so far."""
        return max(0, int(self.client.hget(self._key("deliveries"), task_id) or 1) - 1)

    def started(self, task_id: str, limit_key: str, slots: int, waits: int,
                admitted_ms: int = 0) -> None:
        """Record that ``task_id`` entered its body holding a slot of ``limit_key``, admitted
        at ``admitted_ms`` (the lock store's clock)."""
        level = self.client.incr(self._key("running", limit_key))
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(self._key("levels", limit_key), level)
        pipe.hincrby(self._key("starts"), task_id, 1)
        pipe.sadd(self._key("limit-keys"), limit_key)
        pipe.zadd(self._key("admitted", limit_key), {task_id: admitted_ms})
        pipe.hset(self._key("run", task_id), mapping={
            "limit_key": limit_key, "slots": slots, "waits": waits,
            "start_us": self._now_us(), "admitted_ms": admitted_ms,
        })
        pipe.execute()

    def ended(self, task_id: str, limit_key: str) -> None:
        """Record that ``task_id`` is leaving its body (it still holds its slot)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self._key("run", task_id), "end_us", self._now_us())
        pipe.decr(self._key("running", limit_key))
        pipe.incr(self._key("ended", limit_key))
        pipe.execute()

    def now_us(self) -> int:
        """The record store's clock, in microseconds."""
        return self._now_us()

    def progress(self, limit_keys: Sequence[str]) -> Dict[str, Progress]:
        """For each of ``limit_keys``: runs inside their bodies now, started, ended."""
        pipe = self.client.pipeline(transaction=False)
        for limit_key in limit_keys:
            pipe.get(self._key("running", limit_key))
            pipe.llen(self._key("levels", limit_key))
            pipe.get(self._key("ended", limit_key))
        replies = pipe.execute()
        return {
            limit_key: Progress(*(int(value or 0) for value in replies[3 * n:3 * n + 3]))
            for n, limit_key in enumerate(limit_keys)
        }

    def starts(self) -> Dict[str, int]:
        """How many times each task id entered its body."""
        raw = self.client.hgetall(self._key("starts"))
        return {task_id.decode(): int(count) for task_id, count in raw.items()}

    def levels(self, limit_key: str) -> List[int]:
        """Every value the ``running`` counter of ``limit_key`` reached, in order."""
        return [int(level) for level in self.client.lrange(self._key("levels", limit_key), 0, -1)]

    def recent_starts(self, limit_key: str, seconds: float) -> int:
        """How many runs of ``limit_key`` were admitted in the last ``seconds``."""
        now_ms = self._now_us() // 1000
        return int(self.client.zcount(self._key("admitted", limit_key),
                                      f"({now_ms - seconds * 1000:.0f}", "+inf"))

    def run(self, task_id: str) -> Optional[Run]:
        """The record of ``task_id``'s run, or None if it never started."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self._key("run", task_id))
        pipe.hget(self._key("asked"), task_id)
        fields, asked = pipe.execute()
        raw = {k.decode(): v.decode() for k, v in fields.items()}
        if not raw:
            return None
        end = raw.get("end_us")
        admitted = int(raw.get("admitted_ms") or 0)
        return Run(
            task_id=task_id,
            limit_key=raw["limit_key"],
            slots=int(raw["slots"]),
            start_us=int(raw["start_us"]),
            end_us=int(end) if end is not None else None,
            waits=int(raw["waits"]),
            asked_us=int(asked) if asked is not None else None,
            admitted_ms=admitted or None,
        )


_recorder: Optional[Recorder] = None


def recorder() -> Recorder:
    """This process's :class:`Recorder`, configured from ``PROJ_RECORD_URL`` and friends.

    redis-py notices a fork and reconnects in the child, so one recorder serves every
    process of a prefork worker.
    """
    global _recorder
    if _recorder is None:
        url = (os.environ.get("PROJ_RECORD_URL") or os.environ.get("PROJ_REDISLOCK_URL")
               or os.environ["PROJ_BROKER_URL"])
        prefix = os.environ.get("PROJ_RECORD_PREFIX") or DEFAULT_PREFIX
        _recorder = Recorder(redis.Redis.from_url(url, socket_timeout=10), prefix)
    return _recorder
