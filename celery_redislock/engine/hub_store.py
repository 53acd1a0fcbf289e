"""The lock store as an event loop sees it: script calls that never block the loop
(the worker's ``redislock_gate = "async"``, the default).

A :class:`HubStore` is one connection to the lock store, driven by an event loop with
the interface of kombu's ``Hub`` (``add_reader``, ``add_writer``, ``remove``,
``remove_writer``, ``call_soon``, ``call_later``, ``call_repeatedly``; the worker's main
process passes its own, see :mod:`celery_redislock.gate.hub_store`): the socket
does not block, the hub calls back when it is readable (replies) or, once, writable
(the connection made). A script call is written at the loop's next turn (with every
call queued in the same turn) when no earlier call waits for its reply; else it waits
for those replies, and every call queued meanwhile goes in one write (see
:class:`~..engine.resp.Pipeline`). The release of a lease taken so (uncontended) goes
with the next ask, or alone after :data:`RIDE`. A reply that does not come
within the ``deadline`` it is given fails every call in flight with a ``TimeoutError``
and drops the connection (the caller handles each as a store that cannot be reached).
A ``NOSCRIPT`` reply sends the script whole, once.

Only a plain ``redis://`` or ``unix://`` lock store (no TLS, Sentinel or Cluster) is
driven so (:meth:`HubStore.unsupported` says why not). A host name is resolved once, at
the first connection. Nothing here imports Celery or kombu.

    >>> HubStore.unsupported(redis.Redis.from_url("rediss://localhost"))
    "the lock store's connection is not plain TCP or a Unix socket (TLS)"
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import redis
from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

from .admission import CONTENDED, Lease, handoffs_of, wake_of
from .resp import ErrorReply, Parser, Pipeline, Then, pack
from .scripts import RELEASE, WAKE, LuaScript, is_cluster

logger = logging.getLogger(__name__)

#: How long (s) at most a release waits for an ask to go with, in the same write.
RIDE = 0.005

_CONNECTIONS = (redis.Connection, redis.UnixDomainSocketConnection)


class HubStore:
    """One non-blocking connection to the lock store of ``client``, on ``hub``; a call
    unanswered after ``deadline`` seconds fails."""

    def __init__(self, hub: Any, client: Any, deadline: float) -> None:
        self.hub, self.client, self.deadline = hub, client, deadline
        self.options = dict(client.connection_pool.connection_kwargs)
        self.pipeline = Pipeline()
        self.parser = Parser(bool(self.options.get("decode_responses")))
        self.sock: Optional[socket.socket] = None
        self.connecting = False
        self.unsent = b""
        self.address: Optional[Tuple[int, Any]] = None
        #: A long write's rest is to be written at the loop's next turn.
        self.retrying = False
        #: A release waits for an ask to go with (see :data:`RIDE`).
        self.riding = False
        #: A write is due at the event loop's next turn.
        self.flushing = False
        hub.call_repeatedly(max(0.05, deadline / 4), self._check_deadline)

    @staticmethod
    def unsupported(client: Any) -> Optional[str]:
        """Why ``client``'s store cannot be driven so; None when it can."""
        if is_cluster(client) or type(getattr(client, "connection_pool", None)) not in (
                redis.ConnectionPool, redis.BlockingConnectionPool):
            return "the lock store's client is not a plain redis.Redis (Cluster, Sentinel)"
        if client.connection_pool.connection_class not in _CONNECTIONS:
            return "the lock store's connection is not plain TCP or a Unix socket (TLS)"
        return None

    def run_script(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any],
                   then: Then) -> None:
        """Run ``script`` without waiting: ``then`` gets its reply, or a ``RedisError``
        (an error reply, the connection failed, no reply within the deadline)."""
        name, sha = script.evalsha(self.client)
        self.send(pack(name, sha, len(keys), *keys, *args),
                  _ScriptReply(self, script, keys, args, then))

    def send(self, packed: bytes, then: Then, ask: bool = True) -> None:
        """Queue one command: an ask (see :class:`~..engine.resp.Pipeline`), or one
        nobody waits for (a release), which goes with the next ask, or alone after
        :data:`RIDE`."""
        now = time.monotonic()
        if self.pipeline.overdue(now, self.deadline):  # should the loop's timer be gone
            self._fail(TimeoutError(f"the lock store did not answer within {self.deadline} s"))
        if self.pipeline.queue(packed, then, ask=ask, now=now):
            self._flush_soon()
        elif not ask and not self.riding:
            self.riding = True
            self.hub.call_later(RIDE, self._ride_ended)

    def _flush_soon(self) -> None:
        """Write what is queued at the event loop's next turn, once: every ask and
        release queued during this turn (the messages received, the results read) goes
        in one write."""
        if not self.flushing:
            self.flushing = True
            self.hub.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self.flushing = False
        if self.pipeline.outbox and self.pipeline.asks_unanswered == 0:
            self._flush()

    def _ride_ended(self) -> None:
        self.riding = False
        if self.pipeline.outbox:
            self._flush()

    def release(self, lease: Lease, publish: Callable[[List[Any]], Any]) -> bool:
        """Give ``lease`` back without waiting, as :meth:`Lease.release_soon` does (a
        line that formed meanwhile is handed the slot, ``publish`` gets the messages);
        False for a lease this cannot release so (see :meth:`Lease.release_commands`)."""
        commands = lease.release_commands()
        if commands is None:
            return False
        self._send_release(commands, _Released(self, lease.wake_after, lambda: lease, publish))
        return True

    def release_record(self, handed: Dict[str, Any], publish: Callable[[List[Any]], Any]
                       ) -> bool:
        """:meth:`release` of the lease of ``handed``, a :meth:`Lease.handover` record of
        an admission of this process (never adopted), read from the record itself: the
        same two commands, with no :class:`Lease` made unless a reply needs one (a
        failure, a wake's answer). False where :meth:`Lease.release_commands` answers
        None (a line, the last slot taken, several keys or parts) and for weighted
        costs (their units: :meth:`release`)."""
        keys = handed["keys"]
        if (len(keys) != 1 or handed["parts"] or handed["costs"] or handed["contended"]
                or handed["last"]):
            return False
        key, reserve_ms = keys[0], int(handed["reserve"])
        self._send_release(
            [("ZREM", key, handed["member"]), ("ZSCORE", key, CONTENDED)],
            _Released(self, lambda removed, contended: wake_of(key, reserve_ms, removed,
                                                               contended),
                      lambda: Lease.of_handover(self.client, handed), publish))
        return True

    def _send_release(self, commands: List[Tuple[Any, ...]], released: _Released) -> None:
        """Send a release's ``commands``, nobody waiting; ``released`` gets the replies."""
        released.expected = len(commands)
        for command in commands:
            self.send(pack(*command), released, ask=False)

    def give_back(self, handed: Dict[str, Any], publish: Callable[[List[Any]], Any]) -> bool:
        """Give back, without waiting, the lease of ``handed`` (:meth:`Lease.handover`)
        for a run that never started, whatever its key's state: ``release.lua``, which
        hands the slot to a line that waits (``publish`` gets the messages or moves);
        False for a lease of several parts or keys, or none (the caller gives it back
        itself)."""
        keys = list(handed.get("keys") or ())
        if handed.get("parts") or len(keys) != 1:
            return False
        args = [handed["member"], 0, int(handed.get("reserve") or 0),
                *(int(cost) for cost in handed.get("costs") or ())]

        def replied(reply: Any) -> None:
            if not isinstance(reply, list):
                return logger.warning(
                    "celery-redislock: the slot of %r taken ahead of a free pool process "
                    "could not be given back (%s); it comes back when its lease ends",
                    handed.get("name"), reply)
            moved = handoffs_of(reply[1:])
            if moved:
                publish(moved)
            return None

        self.run_script(RELEASE, keys, args, replied)
        return True

    def _flush(self) -> None:
        if self.sock is None:
            try:
                self._connect()
            except OSError as exc:
                return self._fail(ConnectionError(f"could not connect to the lock store: {exc}"))
        if self.connecting:
            return None
        self.unsent += self.pipeline.take()
        return self._write()

    def _write(self) -> None:
        """Write what is unsent; the rest of a long write goes at the loop's next turns
        (kombu's poller watches one direction per socket: this one reads)."""
        assert self.sock is not None
        try:
            sent = self.sock.send(self.unsent) if self.unsent else 0
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            return self._fail(ConnectionError(f"lost the lock store: {exc}"))
        self.unsent = self.unsent[sent:]
        if self.unsent and not self.retrying:
            self.retrying = True
            self.hub.call_later(0.001, self._write_rest)
        return None

    def _write_rest(self) -> None:
        self.retrying = False
        if self.sock is not None and not self.connecting:
            self._write()

    def _connected(self) -> None:
        """The connection is made (or failed): from now on the socket is read."""
        if self.sock is None:
            return None
        self.hub.remove_writer(self.sock)
        error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            return self._fail(ConnectionError(
                f"could not connect to the lock store: {errno.errorcode.get(error)}"))
        self.connecting = False
        self.hub.add_reader(self.sock, self._readable)
        return self._flush()

    def _connect(self) -> None:
        """Start connecting (the hub says when it is done); the handshake (``AUTH``,
        ``SELECT``) goes first, ahead of what is queued."""
        family, address = self.address = self.address or self._resolve()
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            sock.close()
            raise OSError(code, errno.errorcode.get(code, "connect failed"))
        self.sock, self.connecting, self.unsent = sock, code != 0, b""
        self.parser = Parser(bool(self.options.get("decode_responses")))
        if self.connecting:
            self.hub.add_writer(sock, self._connected)
        else:
            self.hub.add_reader(sock, self._readable)
        for command in reversed(self._handshake()):
            self.pipeline.first(pack(*command), self._shaken)

    def _resolve(self) -> Tuple[int, Any]:
        if self.options.get("path"):
            return socket.AF_UNIX, self.options["path"]
        host, port = self.options.get("host", "localhost"), int(self.options.get("port", 6379))
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        return family, address

    def _handshake(self) -> List[Tuple[Any, ...]]:
        """The commands that a new connection sends first, as redis-py's would."""
        options = self.options
        commands: List[Tuple[Any, ...]] = []
        if options.get("password") is not None:
            commands.append(("AUTH", *([options["username"]] if options.get("username")
                                       else []), options["password"]))
        if int(options.get("db") or 0):
            commands.append(("SELECT", int(options["db"])))
        return commands

    def _shaken(self, reply: Any) -> None:
        if isinstance(reply, ErrorReply):
            self._fail(ResponseError(f"the lock store refused the connection: {reply}"))

    def _readable(self) -> None:
        if self.sock is None:
            return None
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return None
        except OSError as exc:
            return self._fail(ConnectionError(f"lost the lock store: {exc}"))
        if not data:
            return self._fail(ConnectionError("the lock store closed the connection"))
        self.parser.feed(data)
        try:
            replies = self.parser.replies()
        except ValueError as exc:
            return self._fail(ConnectionError(str(exc)))
        _call_each(self.pipeline.answered(replies))
        if self.pipeline.due():
            self._flush_soon()
        return None

    def _check_deadline(self) -> None:
        if self.pipeline.overdue(time.monotonic(), self.deadline):
            self._fail(TimeoutError(f"the lock store did not answer within {self.deadline} s"))

    def _fail(self, exc: RedisError) -> None:
        """Drop the connection; every call queued or in flight gets ``exc``."""
        if self.sock is not None:
            self.hub.remove(self.sock)
            self.sock.close()
        self.sock, self.connecting, self.unsent = None, False, b""
        _call_each(self.pipeline.fail(exc))


class _ScriptReply:
    """What :meth:`HubStore.run_script` does with the reply to its ``EVALSHA``: hand it
    to ``then``, or on ``NOSCRIPT`` send the script whole; on Redis before 7, whose
    compiler refuses the ``#!lua`` flags line, once more without it (twice at most:
    ``eval_again`` answers None once the plain form failed). (An object, not a closure
    that names itself: such a closure is a reference cycle, which would keep everything
    its caller's callback refers to until the garbage collector runs.)"""

    __slots__ = ("args", "keys", "script", "sent_whole", "store", "then")

    def __init__(self, store: HubStore, script: LuaScript, keys: Sequence[str],
                 args: Sequence[Any], then: Then) -> None:
        self.store, self.script, self.keys, self.args, self.then = (
            store, script, keys, args, then)
        self.sent_whole = 0  # times the script was sent whole

    def __call__(self, reply: Any) -> None:
        if isinstance(reply, ErrorReply):
            store = self.store
            again = (None if self.sent_whole >= 2
                     else self.script.eval_again(store.client, reply))
            if again is None:
                return self.then(ResponseError(str(reply)))
            self.sent_whole += 1
            return store.send(pack(*again, len(self.keys), *self.keys, *self.args), self)
        if isinstance(reply, BaseException) and not isinstance(reply, RedisError):
            reply = ConnectionError(f"the lock store failed: {reply!r}")
        return self.then(reply)


class _Released:
    """The replies to one release's commands (see :meth:`HubStore.release`): once all
    are in, a failure is logged, or ``wake.lua`` runs when a line formed meanwhile
    (``wake_after(*replies)``: its keys and arguments, or None). ``lease_of()`` makes
    the lease, for the log and the wake's answer only."""

    __slots__ = ("expected", "lease_of", "publish", "replies", "store", "wake_after")

    def __init__(self, store: HubStore,
                 wake_after: Callable[..., Optional[Tuple[List[str], List[Any]]]],
                 lease_of: Callable[[], Lease], publish: Callable[[List[Any]], Any]) -> None:
        self.store, self.wake_after, self.lease_of, self.publish = (
            store, wake_after, lease_of, publish)
        self.replies: List[Any] = []
        self.expected = 0

    def __call__(self, reply: Any) -> None:
        replies = self.replies
        replies.append(reply)
        if len(replies) < self.expected:
            return None
        for one in replies:
            if isinstance(one, (BaseException, ErrorReply)):
                return _release_failed(self.lease_of(), one)
        wake = self.wake_after(*replies)
        if wake is not None:
            lease, publish = self.lease_of(), self.publish
            self.store.run_script(WAKE, *wake, then=lambda messages: _woken(lease, publish,
                                                                       messages))
        return None


def _release_failed(lease: Lease, failure: Any) -> None:
    logger.warning("celery-redislock: the release of %r by holder %s failed (%s); its slot "
                   "comes back when its lease ends, within %.0f s", lease.name, lease.token,
                   failure, lease.lease_seconds)


def _woken(lease: Lease, publish: Callable[[List[Any]], Any], moves: Any) -> None:
    """The answer of ``wake.lua`` after a release: the moves owed to the parked line
    handed the slot."""
    if not isinstance(moves, list):
        return _release_failed(lease, moves)
    if moves:
        publish(handoffs_of(moves))
    return None


def _call_each(answered: Sequence[Tuple[Callable[[Any], None], Any]]) -> None:
    """Hand each reply to its callback; one that fails does not keep the others' back."""
    for then, reply in answered:
        try:
            then(reply)
        except Exception:  # a callback's own failure, logged: the others go on
            logger.exception("celery-redislock: a reply of the lock store was not handled")
