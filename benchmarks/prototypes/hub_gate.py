"""Prototype: admission from the worker's main process that never blocks its event loop.

Today the main process asks ``admit.lua`` with a blocking call (one round trip on a
socket it waits on) for every limited run before the run goes to the pool. Here the same
script, with the same arguments, is sent on a non-blocking socket registered with
kombu's event loop (the ``Hub`` Celery's worker runs on):

* an ask is written at once when no earlier ask waits for its reply; else it waits for
  those replies, and every ask that arrived meanwhile goes in one write, which Redis
  answers in one read (pipelining that batches itself, as ioredis' auto-pipelining
  does); a release goes with the next ask, or at the loop's next turn
  (``hub.call_soon``);
* the replies are read when the socket is readable (``hub.add_reader``) and parsed with
  ``hiredis.Reader``; each goes, in order, to the callback of its ask, which hands the
  request to the pool (admitted) or sends it back (refused: this prototype only logs,
  the benchmark never refuses);
* a lease taken here is given back, when the pool reports the run's end, by a ``ZREM``
  of the holder that rides with the next ask, or goes alone after :data:`RIDE` (as
  today's uncontended release does); a release of a key the admission found contended
  goes at the loop's next turn;
* at most ``concurrency + lookahead`` limited runs are asked for or running at once, the
  others wait here in arrival order and are asked for when a run ends: a slot is not
  taken for a run that waits for a pool process. ``lookahead`` (``NB_LOOKAHEAD``,
  default: the pool's concurrency) asks ahead of the free processes only while the
  last admission said the key has no line and slots to spare (``contended`` and
  ``last`` both 0 in the reply), so that the round trip overlaps the runs in progress
  without holding a slot another run waits for;
* a reply that does not come within ``NB_DEADLINE`` seconds fails every ask in flight
  (the requests would be sent back, fail-closed; here they are logged) and drops the
  connection: a store that does not answer stalls nothing but its own runs.

The task is declared as ``Task`` with ``Strategy = "benchmarks.prototypes.hub_gate:
hub_strategy"`` and a ``hub_limit = (name, slots)`` attribute. Only for measuring; see
``benchmarks/prototypes/README.md``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple
from urllib.parse import urlparse

import hiredis
from celery.worker.strategy import default as default_strategy

from celery_redislock.engine.keys import semaphore_key
from celery_redislock.engine.scripts import ADMIT

logger = logging.getLogger(__name__)

LEASE_MS = 60000
#: How long at most a release nobody waits for waits for an ask to ride with (s).
RIDE = 0.005
Reply = Callable[[Any], None]


def _pack(*args: Any) -> bytes:
    """One command in Redis's protocol (RESP)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class HubRedis:
    """One connection to Redis driven by the worker's event loop: :meth:`send` never
    waits; replies come to each command's callback, in order."""

    def __init__(self, hub: Any, url: str, deadline: float) -> None:
        self.hub = hub
        self.url = urlparse(url)
        self.deadline = deadline
        self.sock: Optional[socket.socket] = None
        self.reader = hiredis.Reader()
        self.pending: Deque[Tuple[float, Reply, bool]] = deque()
        self.outbox: List[bytes] = []
        self.flush_queued = False
        self.writes = 0
        self.asks_queued = 0
        self.asks_unanswered = 0
        self.ride_queued = False
        self.commands = 0
        hub.call_repeatedly(max(0.05, deadline / 4), self._check_deadline)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.url.hostname, self.url.port or 6379), 2.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.hub.add_reader(sock, self._readable)
        self.reader = hiredis.Reader()
        self.sock = sock
        return sock

    def send_packed(self, packed: bytes, then: Reply, ask: bool = False) -> None:
        """:meth:`send` of a command already in Redis's protocol."""
        self.outbox.append(packed)
        self._queued(then, ask)

    def send_later(self, *command: Any, then: Reply, within: float) -> None:
        """Queue ``command`` to ride with the next ask, or go alone ``within`` seconds
        from now if no ask comes first (a release nobody waits for)."""
        self.outbox.append(_pack(*command))
        self._queued(then, False, within)

    def send(self, *command: Any, then: Reply, ask: bool = False) -> None:
        """Queue ``command``. An ask (``ask=True``) is written at once when no earlier
        ask waits for its reply, with whatever else is queued; else it waits for those
        replies, and every ask queued meanwhile goes in one write (pipelining that
        batches itself). Anything else (a release) goes at the loop's next turn, or
        with the next ask, whichever is first."""
        self.outbox.append(_pack(*command))
        self._queued(then, ask)

    def _queued(self, then: Reply, ask: bool, within: float = 0.0) -> None:
        self.pending.append((time.monotonic(), then, ask))
        if ask:
            self.asks_queued += 1
            if self.asks_unanswered == 0:
                self._flush()
                return
        if within:
            if not self.ride_queued:
                self.ride_queued = True
                self.hub.call_later(within, self._ride_ended)
        elif not self.flush_queued:
            self.flush_queued = True
            self.hub.call_soon(self._flush_soon)

    def _ride_ended(self) -> None:
        self.ride_queued = False
        self._flush()

    def _flush_soon(self) -> None:
        self.flush_queued = False
        self._flush()

    def _flush(self) -> None:
        if not self.outbox:
            return
        data, self.outbox = b"".join(self.outbox), []
        self.asks_unanswered += self.asks_queued
        self.asks_queued = 0
        self.writes += 1
        try:
            sock = self.sock or self._connect()
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._fail(exc)
            return
        if sent < len(data):
            self.outbox.insert(0, data[sent:])
            self.hub.add_writer(sock, self._writable)

    def _writable(self) -> None:
        if self.sock is not None:
            self.hub.remove_writer(self.sock)
        self._flush()

    def _readable(self) -> None:
        if self.sock is None:
            return
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        if not data:
            self._fail(ConnectionError("the lock store closed the connection"))
            return
        self.reader.feed(data)
        while True:
            reply = self.reader.gets()
            if reply is False:
                break
            self.commands += 1
            _, then, was_ask = self.pending.popleft()
            if was_ask:
                self.asks_unanswered -= 1
            then(reply)
        if self.asks_unanswered == 0 and self.asks_queued:
            self._flush()  # the asks that came meanwhile, with any release queued

    def _check_deadline(self) -> None:
        if self.pending and time.monotonic() - self.pending[0][0] > self.deadline:
            self._fail(TimeoutError(f"no reply within {self.deadline} s"))

    def _fail(self, exc: BaseException) -> None:
        """Drop the connection; every command in flight gets ``exc`` as its reply."""
        if self.sock is not None:
            self.hub.remove(self.sock)
            self.sock.close()
            self.sock = None
        pending, self.pending = self.pending, deque()
        self.outbox, self.asks_queued, self.asks_unanswered = [], 0, 0
        for _, then, _ in pending:
            then(exc)


class Gate:
    """The admissions of one worker's main process (one per process)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        url = os.environ["REDISLOCK_BENCH_LOCK_URL"]
        self.client = HubRedis(consumer.hub, url, float(os.environ.get("NB_DEADLINE", "2")))
        self.concurrency = max(1, int(getattr(consumer.pool, "num_processes", 0)
                                      or consumer.controller.concurrency or 1))
        self.lookahead = int(os.environ.get("NB_LOOKAHEAD", self.concurrency))
        self.spare = True  # the last admission found no line and slots to spare
        self.in_flight = 0
        self.waiting: Deque[Tuple[Any, Callable[[Any], None], str, int]] = deque()
        self.sha = ADMIT.sha
        self.source = ADMIT.source
        self.token_base = f"nb{os.getpid()}."
        self.tokens = 0
        self.templates: Dict[str, Tuple[str, bytes, bytes]] = {}

    def room(self) -> bool:
        limit = self.concurrency + (self.lookahead if self.spare else 0)
        return self.in_flight < limit

    def ask(self, request: Any, handle: Callable[[Any], None], name: str, slots: int) -> None:
        """Ask for ``request``'s slot without waiting; hand it to the pool when admitted."""
        if not self.room():
            self.waiting.append((request, handle, name, slots))
            return
        self.in_flight += 1
        self.tokens += 1
        key, head, tail = self._template(name, slots)
        token = f"{self.token_base}{self.tokens}"
        args = (token, LEASE_MS, "nb", "", "", 0, 0, f"s:{slots}", 0)
        self.client.send_packed(
            b"%s$%d\r\n%s\r\n%s" % (head, len(token), token.encode(), tail),
            lambda reply: self._answered(reply, request, handle, key, token, args), True)

    def _template(self, name: str, slots: int) -> Tuple[str, bytes, bytes]:
        """The key of semaphore ``name`` and its ask in Redis's protocol, less the token
        (made once per name: an ask then costs one bytes formatting)."""
        made = self.templates.get(name)
        if made is None:
            key = semaphore_key(name)
            whole = _pack("EVALSHA", self.sha, 1, key, "\0", LEASE_MS, "nb", "", "", 0, 0,
                          f"s:{slots}", 0)
            head, tail = whole.split(b"$1\r\n\0\r\n")
            made = self.templates[name] = (key, head, tail)
        return made

    def _answered(self, reply: Any, request: Any, handle: Callable[[Any], None], key: str,
                  token: str, args: Tuple[Any, ...]) -> None:
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
            self.client.send("EVAL", self.source, 1, key, *args,
                             then=lambda again: self._answered(again, request, handle, key,
                                                               token, args), ask=True)
            return
        if isinstance(reply, bytes):  # admitted: "now_ms lease_end_ms fence contended last"
            now_ms, _, fence, contended, last = reply.split()
            self.spare = contended == b"0" and last == b"0"
            member = f"{token} {int(now_ms)} {int(fence)} nb"
            self._release_at_end(request, key, member, self.spare)
            handle(request)
            return
        # Refused or failed: a real gate sends the run back (a move); never here.
        logger.error("prototype gate: %s not admitted: %r", request.id, reply)
        self._ended()

    def _release_at_end(self, request: Any, key: str, member: str, spare: bool) -> None:
        ended_well, ended_badly = request.on_success, request.on_failure

        def succeeded(*args: Any, **kwargs: Any) -> Any:
            try:
                return ended_well(*args, **kwargs)
            finally:
                self._release(key, member, spare)

        def failed(*args: Any, **kwargs: Any) -> Any:
            try:
                return ended_badly(*args, **kwargs)
            finally:
                self._release(key, member, spare)

        request.on_success, request.on_failure = succeeded, failed

    def _release(self, key: str, member: str, spare: bool) -> None:
        if spare:  # nobody waits for the slot: it rides with the next ask
            self.client.send_later("ZREM", key, member, then=_ignore, within=RIDE)
        else:  # a line may wait (today: release.lua hands it over): at once
            self.client.send("ZREM", key, member, then=_ignore)
        self._ended()

    def _ended(self) -> None:
        self.in_flight -= 1
        while self.waiting and self.room():
            self.ask(*self.waiting.popleft())


def _ignore(reply: Any) -> None:
    if isinstance(reply, BaseException):
        logger.warning("prototype gate: release failed: %r", reply)


_GATES: Dict[int, Gate] = {}


def gate_of(consumer: Any) -> Gate:
    gate = _GATES.get(id(consumer))
    if gate is None:
        gate = _GATES[id(consumer)] = Gate(consumer)
    return gate


class _Consumer:
    """The consumer as the default strategy sees it, its requests passed to the gate."""

    def __init__(self, consumer: Any, task: Any) -> None:
        self._consumer = consumer
        name, slots = task.hub_limit
        handle = consumer.on_task_request
        self.on_task_request = lambda request: gate_of(consumer).ask(
            request, handle, name, slots)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def hub_strategy(task: Any, app: Any, consumer: Any, **options: Any) -> Any:
    """Celery's default strategy, each request asked for without blocking (see above)."""
    if consumer.hub is None:
        raise RuntimeError("the prototype gate needs a worker with an event loop")
    return default_strategy(task, app, _Consumer(consumer, task), **options)
