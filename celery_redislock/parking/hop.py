"""Hand a mover's results to the worker's event loop, from the mover's thread.

kombu's ``hub.call_soon`` is safe from another thread only since kombu 5.7 (a lock and a
waker); this package supports kombu 5.3. :class:`LoopHop` works with every version: the
mover's thread appends the call to a queue and writes a byte to a pipe whose read end
the loop watches (``hub.add_reader``); the loop then runs every queued call, in order.

    >>> from kombu.asynchronous import Hub
    >>> hub = Hub()
    >>> hop = LoopHop(hub)
    >>> seen = []
    >>> on_done = hop.on_loop(seen.append)     # what Mover.park / Mover.move take
    >>> on_done("parked")                      # called on the mover's thread
    >>> hub.run_once(); seen                   # the loop's next turn runs it
    ['parked']
    >>> hop.close()
"""

from __future__ import annotations

import collections
import functools
import logging
import os
from typing import Any, Callable, Deque

logger = logging.getLogger(__name__)


class LoopHop:
    """Runs on ``hub``'s loop the calls other threads give :meth:`call`."""

    def __init__(self, hub: Any) -> None:
        self._hub = hub
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._calls: Deque[Callable[[], Any]] = collections.deque()
        self._closed = False
        hub.add_reader(self._read, self._run)

    def call(self, function: Callable[[], Any]) -> None:
        """Run ``function()`` at the loop's next turn (thread-safe, never blocks)."""
        self._calls.append(function)
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the loop has turns owed already
        except OSError:
            logger.debug("redislock: a call handed to a closed loop hop", exc_info=True)

    def on_loop(self, callback: Callable[[Any], Any]) -> Callable[[Any], None]:
        """A callback for another thread that runs ``callback(result)`` on the loop."""
        def hop(result: Any) -> None:
            self.call(functools.partial(callback, result))
        return hop

    def _run(self, *_: Any) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass  # read all: now run every call queued before the bytes read
        while self._calls:
            function = self._calls.popleft()
            try:
                function()
            except Exception:
                logger.exception("redislock: a call handed to the event loop failed")

    def close(self) -> None:
        """Stop watching the pipe and close it (calls still queued are dropped)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._hub.remove_reader(self._read)
        finally:
            os.close(self._read)
            os.close(self._write)
