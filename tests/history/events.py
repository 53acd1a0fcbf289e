"""The history's events, written to the recorder Redis (never faulted) and read back.

Every event is one JSON object appended to the list :data:`HISTORY` by one Lua script,
which stamps it with ``t``: the recorder's server clock in µs, the one clock every process
shares. A body's start also enters the hash :data:`RUNNING` (run -> ``"<pid> <worker>"``)
and its end leaves it: the fault injector picks busy pool processes there. Both count in
:data:`BODIES`: while it grows, the run has not settled.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Tuple

import redis

HISTORY = "history"
RUNNING = "running"
BODIES = "bodies"

_RECORD = """
local now = redis.call('TIME')
local micros = string.format('%.0f', tonumber(now[1]) * 1000000 + tonumber(now[2]))
local event = cjson.decode(ARGV[1])
event['t'] = micros
redis.call('RPUSH', KEYS[1], cjson.encode(event))
if ARGV[2] == 'start' then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('INCR', KEYS[3])
elseif ARGV[2] == 'end' then
  redis.call('HDEL', KEYS[2], ARGV[3])
  redis.call('INCR', KEYS[3])
end
return micros
"""


class Recorder:
    """Writes events to the recorder at ``url``; one per process (:func:`recorder`).

    redis-py notices a fork and reconnects in the child, so a pool process inherits it.
    """

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10,
                                           decode_responses=True)
        self._record = self.client.register_script(_RECORD)

    def event(self, kind: str, **fields: Any) -> int:
        """Append an event of ``kind`` with ``fields``; its time (µs, recorder's clock)."""
        return self._write(kind, fields, "", "", "")

    def started(self, run: str, pid: int, worker: str, **fields: Any) -> int:
        """A body began: ``start`` event, and ``run`` enters the running bodies."""
        return self._write("start", {"run": run, "pid": pid, "worker": worker, **fields},
                           "start", run, f"{pid} {worker}")

    def ended(self, run: str, **fields: Any) -> int:
        """That body ended: ``end`` event, and ``run`` leaves the running bodies."""
        return self._write("end", {"run": run, **fields}, "end", run, "")

    def _write(self, kind: str, fields: Dict[str, Any], op: str, run: str, where: str) -> int:
        event = json.dumps({"kind": kind, **fields})
        return int(self._record(keys=[HISTORY, RUNNING, BODIES],
                                args=[event, op, run, where]))

    def bodies_seen(self) -> int:
        """How many body starts and ends were recorded so far (the history's progress)."""
        return int(self.client.get(BODIES) or 0)

    def running(self) -> List[Tuple[str, int, str]]:
        """The bodies running now: (run, pid, worker), sorted by run."""
        found = []
        for run, where in sorted(self.client.hgetall(RUNNING).items()):
            pid, worker = where.split(" ", 1)
            found.append((run, int(pid), worker))
        return found

    def history(self) -> List[Dict[str, Any]]:
        """Every event so far, in the order written, ``t`` as an int."""
        events = []
        for raw in self.client.lrange(HISTORY, 0, -1):
            event = json.loads(raw)
            event["t"] = int(event["t"])
            events.append(event)
        return events


_recorders: Dict[str, Recorder] = {}
_guard = threading.Lock()


def recorder(url: str) -> Recorder:
    """The :class:`Recorder` of ``url``, made once per process."""
    with _guard:
        if url not in _recorders:
            _recorders[url] = Recorder(url)
        return _recorders[url]
