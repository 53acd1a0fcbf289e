"""A TCP proxy on 127.0.0.1 that delays every byte by a fixed time in each direction.

It stands for a lock store in another host of the same region (a managed Redis ~1 ms
away each way). Every chunk read from one side is written to the other ``--delay-ms``
after it was read, in order; nothing is dropped or reordered. Bounded: it stops by
itself after ``--seconds`` (default 600), or as soon as its parent process exits, and it
only listens on loopback.

    python -m benchmarks.prototypes.delay_proxy --target 127.0.0.1:6379 --delay-ms 1

prints ``listening <port>`` once ready; :func:`running` starts it for a benchmark:

    with running(lock.port, delay_ms=1.0, seconds=3600) as port:
        lock_url = f"redis://127.0.0.1:{port}/0"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator, Optional, Sequence, Tuple


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived."""
    queue: asyncio.Queue[Tuple[float, bytes]] = asyncio.Queue()

    async def pump_in() -> None:
        while True:
            data = await reader.read(1 << 16)
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def pump_out() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(pump_in(), pump_out())
    except (ConnectionError, asyncio.IncompleteReadError):
        writer.close()


async def _serve(target: Tuple[str, int], delay: float, seconds: float) -> None:
    parent = os.getppid()

    async def handle(client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*target)
        await asyncio.gather(_pipe(client_reader, server_writer, delay),
                             _pipe(server_reader, client_writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end and os.getppid() == parent:
        await asyncio.sleep(0.2)
    server.close()


@contextlib.contextmanager
def running(port: int, delay_ms: float, seconds: float) -> Iterator[int]:
    """This proxy, in its own process, in front of 127.0.0.1:``port``; yields its port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.prototypes.delay_proxy", "--target",
         f"127.0.0.1:{port}", "--delay-ms", str(delay_ms), "--seconds", str(seconds)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError("the delay proxy did not start")
        yield int(line[1])
    finally:
        process.terminate()
        process.wait(timeout=10)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="host:port of the real server")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="delay each way (ms)")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    args = parser.parse_args(argv)
    host, port = args.target.rsplit(":", 1)
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("the proxy only forwards to loopback")
    asyncio.run(_serve((host, int(port)), args.delay_ms / 1000.0, args.seconds))


if __name__ == "__main__":
    main(sys.argv[1:])
