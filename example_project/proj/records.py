"""What the tasks write down about each run, in Redis, and how it is read back.

Every run of a limited task, once it holds its slot, records:

* ``INCR running:<key>`` at its start and ``DECR`` at its end, where ``<key>`` is the name
  of the semaphore it holds; the value ``INCR`` returned (how many runs of that key were
  inside their bodies at that moment, this one included) is appended to ``levels:<key>``;
* its start and end times, from the Redis server's clock (``TIME``), in ``run:<task id>``;
* one more start of its task id in the hash ``starts``, to prove each task ran once.

All keys begin with a prefix (``PROJ_RECORD_PREFIX``), so several demo runs can share a
server without mixing up their records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional

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

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _now_us(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    def delivered(self, task_id: str) -> None:
        """Record that a worker picked up a run of ``task_id`` (admitted or not)."""
        self.client.hincrby(self._key("deliveries"), task_id, 1)

    def times_sent_back(self, task_id: str) -> int:
        """How many deliveries of ``task_id`` were sent back to wait, so far."""
        return max(0, int(self.client.hget(self._key("deliveries"), task_id) or 1) - 1)

    def started(self, task_id: str, limit_key: str, slots: int, waits: int) -> None:
        """Record that ``task_id`` entered its body holding a slot of ``limit_key``."""
        level = self.client.incr(self._key("running", limit_key))
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(self._key("levels", limit_key), level)
        pipe.hincrby(self._key("starts"), task_id, 1)
        pipe.sadd(self._key("limit-keys"), limit_key)
        pipe.hset(self._key("run", task_id), mapping={
            "limit_key": limit_key, "slots": slots, "waits": waits,
            "start_us": self._now_us(),
        })
        pipe.execute()

    def ended(self, task_id: str, limit_key: str) -> None:
        """Record that ``task_id`` is leaving its body (it still holds its slot)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(self._key("run", task_id), "end_us", self._now_us())
        pipe.decr(self._key("running", limit_key))
        pipe.execute()

    def starts(self) -> Dict[str, int]:
        """How many times each task id entered its body."""
        raw = self.client.hgetall(self._key("starts"))
        return {task_id.decode(): int(count) for task_id, count in raw.items()}

    def levels(self, limit_key: str) -> List[int]:
        """Every value the ``running`` counter of ``limit_key`` reached, in order."""
        return [int(level) for level in self.client.lrange(self._key("levels", limit_key), 0, -1)]

    def run(self, task_id: str) -> Optional[Run]:
        """The record of ``task_id``'s run, or None if it never started."""
        raw = {k.decode(): v.decode() for k, v in
               self.client.hgetall(self._key("run", task_id)).items()}
        if not raw:
            return None
        end = raw.get("end_us")
        return Run(
            task_id=task_id,
            limit_key=raw["limit_key"],
            slots=int(raw["slots"]),
            start_us=int(raw["start_us"]),
            end_us=int(end) if end is not None else None,
            waits=int(raw["waits"]),
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
