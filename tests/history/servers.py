"""The Redis servers of one run: the broker (with the result backend), the lock store, and
the recorder. Only the lock store is faulted; it keeps its data (``aof``: append-only,
fsync always) or not (``none``)."""

from __future__ import annotations

import os
import signal
from typing import Dict, List, Optional

import redis

from redis_process import RedisServer
from worker_app import AppUrls

PERSISTENCE: Dict[str, List[str]] = {
    "aof": ["--appendonly", "yes", "--appendfsync", "always"],
    "none": [],
}


class Servers:
    """The three servers, started; :meth:`stop` ends them."""

    def __init__(self, persistence: str) -> None:
        self.persistence = persistence
        self.broker = RedisServer().start()
        self.lock = RedisServer(extra_args=PERSISTENCE[persistence]).start()
        self.record = RedisServer().start()
        self.urls = AppUrls(broker=self.broker.database_url(0),
                            backend=self.broker.database_url(1),
                            lock=self.lock.database_url(0),
                            record=self.record.database_url(0))
        self._admin: Optional[redis.Redis] = None

    @property
    def keeps_data(self) -> bool:
        return self.persistence == "aof"

    def lock_client(self) -> redis.Redis:
        """A client of the lock store that gives up quickly (for faults and checks)."""
        if self._admin is None:
            self._admin = redis.Redis.from_url(self.urls.lock, socket_timeout=5,
                                               socket_connect_timeout=5)
        return self._admin

    def kill_and_restart_lock(self) -> None:
        """``kill -9`` the lock store and start it again on its port: with its data
        (``aof``), or empty (``none``)."""
        process = self.lock.process
        assert process is not None
        process.kill()
        process.wait()
        self.lock.process = None
        self.lock.start()
        if self._admin is not None:
            self._admin.close()

    def signal_lock(self, signum: int) -> Optional[int]:
        """Send ``signum`` to the lock store's process; its pid, or None if it is gone."""
        process = self.lock.process
        if process is None or process.poll() is not None:
            return None
        os.kill(process.pid, signum)
        return process.pid

    def stop(self) -> None:
        self.signal_lock(signal.SIGCONT)
        for server in (self.broker, self.lock, self.record):
            server.cleanup()
