"""Redis set-ups for the tests: Sentinel and Cluster on top of the package's RedisServer."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import redis
import redis.cluster

from celery_redislock.testing import RedisServer, free_port, redis_server_binary

__all__ = ["RedisClusterServers", "RedisServer", "SentinelServer", "free_port"]


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
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.master_name} 1000\n"
        )
        self.process = subprocess.Popen(
            [redis_server_binary(), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if probe.execute_command("SENTINEL", "get-master-addr-by-name",
                                         self.master_name):
                    break
            except redis.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis sentinel did not start on port {self.port}")
            time.sleep(0.02)
        probe.close()
        return self

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
        # Cluster nodes need a port of at most 55535; their bus gets a free port of its own.
        self.bus_ports = [free_port(below=55535) for _ in range(masters)]
        self.servers = [
            RedisServer(port=free_port(below=55535),
                        extra_args=["--cluster-enabled", "yes", "--cluster-config-file",
                                    "nodes.conf", "--cluster-node-timeout", "2000",
                                    "--cluster-port", str(bus_port)])
            for bus_port in self.bus_ports
        ]

    def start(self, timeout: float = 20.0) -> RedisClusterServers:
        for server in self.servers:
            server.start()
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
