"""Redis set-ups for the tests: the package's RedisServer made safe beside other test
processes (pytest-xdist runs the suite in several), Sentinel and Cluster on top of it, and
ports that refuse connections."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple, TypeVar

import redis
import redis.cluster

from celery_redislock.testing import RedisServer as _PackageRedisServer
from celery_redislock.testing import free_port, redis_server_binary

__all__ = ["AddressInUse", "RedisClusterServers", "RedisServer", "SentinelServer",
           "closed_port", "free_port", "started"]

#: How many times a server whose port was taken before it could bind it is started again,
#: on fresh ports.
START_ATTEMPTS = 5

#: What redis-server logs once it listens on its ports, and when one is taken.
_READY = "Ready to accept connections"
_IN_USE = "Address already in use"

_Server = TypeVar("_Server")


class AddressInUse(RuntimeError):
    """A port the server was to listen on was taken between its picking and the bind."""


class RedisServer(_PackageRedisServer):
    """The package's :class:`~celery_redislock.testing.RedisServer`, safe beside other
    processes that pick free ports at the same time (the other pytest-xdist workers).

    ``free_port`` picks a port that nothing listens on *now*; another process may bind it
    before this server does. The package's ``start`` then fails, or worse returns: its
    probe's ping may be answered by the other process's server on that port. Here a start
    counts only once this server's own log says that it listens; a server whose port was
    taken is started again on a fresh port (when the port was not given), else
    :class:`AddressInUse` is raised. A restart keeps its port (tests rely on it): taken,
    it raises :class:`AddressInUse` rather than move.
    """

    def __init__(self, port: Optional[int] = None,
                 extra_args: Optional[List[str]] = None) -> None:
        super().__init__(port=port, extra_args=extra_args)
        self._may_move = port is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        for attempt in range(1, START_ATTEMPTS + 1):
            log = self.directory / "redis.log"
            offset = log.stat().st_size if log.exists() else 0
            deadline = time.monotonic() + timeout
            try:
                super().start(timeout)
            except (RuntimeError, redis.RedisError):
                # Not up in time, or the probe met something else on the port.
                if self._settle(offset, deadline) != "in use":
                    raise
            else:
                state = self._settle(offset, deadline)
                if state in ("ready", "quiet"):
                    self._may_move = False  # a restart keeps the port
                    return self
                if state == "exited":
                    raise RuntimeError(f"redis-server exited at start: "
                                       f"{self._log_since(offset)[-2000:]}")
            self.stop()
            if not self._may_move or attempt == START_ATTEMPTS:
                raise AddressInUse(f"redis-server could not listen on port {self.port}: "
                                   f"{self._log_since(offset)[-2000:]}")
            self.port = free_port()
        raise AssertionError("unreachable")

    def _settle(self, offset: int, deadline: float) -> str:
        """What became of this server's start: ``ready`` (its own log says it listens),
        ``in use`` (it exited, its port taken), ``exited`` (for another reason), or
        ``quiet`` (still running at the deadline without a word: a server that logs below
        notice level, which is taken to listen)."""
        assert self.process is not None
        while True:
            text = self._log_since(offset)
            if _READY in text:
                return "ready"
            if self.process.poll() is not None:
                return "in use" if _IN_USE in self._log_since(offset) else "exited"
            if time.monotonic() > deadline:
                return "quiet"
            time.sleep(0.01)

    def _log_since(self, offset: int) -> str:
        try:
            with (self.directory / "redis.log").open("rb") as log:
                log.seek(offset)
                return log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def started(make: Callable[[], _Server], attempts: int = START_ATTEMPTS) -> _Server:
    """``make()`` started: a server whose ports ``make`` picks (a TLS port, a cluster bus
    port, beside its own), made again with fresh ones while one was taken
    (:class:`AddressInUse`)."""
    for attempt in range(1, attempts + 1):
        server: Any = make()
        try:
            return server.start()
        except AddressInUse:
            server.cleanup()
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A port of 127.0.0.1 that refuses connections for as long as the block runs: a
    socket bound to it, never listening, keeps any other process (another test's server)
    from taking it, where a port merely free now might be taken by the time it is used."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


class SentinelServer:
    """A Redis Sentinel process watching ``master`` under ``master_name``, on a free port.

    Example::

        master = RedisServer().start()
        sentinel = SentinelServer(master).start()
        url = sentinel.url   # "sentinel://127.0.0.1:<port>/0"
    """

    def __init__(self, master: RedisServer, master_name: str = "mymaster") -> None:
        self.master = master
        self.master_name = master_name
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="redislock-test-sentinel-"))
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> SentinelServer:
        """Start the sentinel, on a fresh port while its port was taken before it could
        bind it (by another test process), and wait until it knows the master."""
        for attempt in range(1, START_ATTEMPTS + 1):
            if self._start(timeout):
                return self
            if attempt < START_ATTEMPTS:
                self.port = free_port()
        raise AddressInUse(f"redis sentinel could not listen on port {self.port}")

    def _start(self, timeout: float) -> bool:
        log = self.directory / "sentinel.log"
        log.unlink(missing_ok=True)
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"logfile {log}\n"
            f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.master_name} 1000\n"
        )
        self.process = subprocess.Popen(
            [redis_server_binary(), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.process.poll() is not None:
                    text = log.read_text(errors="replace") if log.exists() else ""
                    if _IN_USE in text:
                        return False
                    raise RuntimeError(f"redis sentinel exited at start: {text[-2000:]}")
                try:
                    if (probe.execute_command("SENTINEL", "get-master-addr-by-name",
                                              self.master_name)
                            and self._listens(log)):
                        return True
                except redis.RedisError:
                    pass  # not up yet, or something else on the port: see above
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis sentinel did not start on port {self.port}")
                time.sleep(0.02)
        finally:
            probe.close()

    def _listens(self, log: Path) -> bool:
        """Whether this sentinel (not another one on its port) listens: it says it is
        ready, or still runs a moment after its bind (a port in use ends it at once)."""
        assert self.process is not None
        if log.exists() and _READY in log.read_text(errors="replace"):
            return True
        time.sleep(0.1)
        return self.process.poll() is None

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)


class RedisClusterServers:
    """A Redis Cluster of ``masters`` redis-server processes (no replicas), on free ports.

    The 16384 hash slots are split evenly with ``CLUSTER ADDSLOTSRANGE`` and the nodes
    introduced with ``CLUSTER MEET``; :meth:`start` returns once the cluster says ``ok``.

        cluster = RedisClusterServers().start()
        client = cluster.client()     # a redis.cluster.RedisCluster
    """

    SLOTS = 16384

    def __init__(self, masters: int = 3) -> None:
        self.bus_ports: List[int] = []
        self.servers: List[RedisServer] = []
        for _ in range(masters):
            bus_port, server = self._node()
            self.bus_ports.append(bus_port)
            self.servers.append(server)

    @staticmethod
    def _node() -> Tuple[int, RedisServer]:
        """A node on fresh ports, not started, and its cluster bus port."""
        # Cluster nodes need a port of at most 55535; their bus gets a free port of its own.
        bus_port = free_port(below=55535)
        return bus_port, RedisServer(
            port=free_port(below=55535),
            extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", "2000", "--cluster-port", str(bus_port)])

    def start(self, timeout: float = 20.0) -> RedisClusterServers:
        for index in range(len(self.servers)):
            # A node's port or bus port taken before it bound them: a node on fresh ones.
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    self.servers[index].start()
                    break
                except AddressInUse:
                    self.servers[index].cleanup()
                    if attempt == START_ATTEMPTS:
                        raise
                    self.bus_ports[index], self.servers[index] = self._node()
        share = self.SLOTS // len(self.servers)
        for index, server in enumerate(self.servers):
            first = index * share
            last = self.SLOTS - 1 if index == len(self.servers) - 1 else first + share - 1
            server.client().execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        seed = self.servers[0].client()
        for server, bus_port in zip(self.servers[1:], self.bus_ports[1:]):
            seed.execute_command("CLUSTER", "MEET", "127.0.0.1", server.port, bus_port)
        deadline = time.monotonic() + timeout
        while not all(b"cluster_state:ok" in server.client().execute_command("CLUSTER", "INFO")
                      for server in self.servers):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not come up")
            time.sleep(0.05)
        return self

    def client(self, **kwargs) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster(host="127.0.0.1", port=self.servers[0].port, **kwargs)

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()
