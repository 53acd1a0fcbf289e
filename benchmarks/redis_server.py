"""A private, throw-away redis-server for the benchmarks: free port, no persistence.

Never touches a shared Redis: the server listens on 127.0.0.1 on a port picked by the
operating system, keeps its files in a temporary directory, and is stopped (and the
directory removed) when the ``with`` block ends::

    with PrivateRedis() as server:
        client = server.client()
        client.ping()
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Optional, Type

import redis

START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str:
    """The ``redis-server`` executable found on PATH."""
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("redis-server was not found on PATH")
    return found


class PrivateRedis:
    """A redis-server child process with ``--save "" --appendonly no`` in a temp dir."""

    def __init__(self, port: Optional[int] = None) -> None:
        self.port = port or free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="redislock-bench-"))
        self.process: Optional[subprocess.Popen[bytes]] = None

    def url(self, db: int = 0) -> str:
        """The ``redis://`` URL of database ``db`` on this server."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        """A new redis-py client of database ``db`` on this server."""
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, **kwargs)

    def start(self, timeout: float = START_TIMEOUT) -> PrivateRedis:
        """Start the server and return once it answers PING (or raise after ``timeout``)."""
        self.process = subprocess.Popen(
            [
                redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.directory),
                "--logfile", str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self._wait_until_ready(timeout)
        return self

    def _wait_until_ready(self, timeout: float) -> None:
        """Poll PING until it answers; fail early if the process died."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                try:
                    if probe.ping():
                        return
                except redis.ConnectionError:
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}: {self.log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            probe.close()

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's log file, for error messages."""
        log = self.directory / "redis.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``) and remove its files."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PrivateRedis:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.stop()
