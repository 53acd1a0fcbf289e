"""One connection per thread for the commands on every task's path.

Every limited run costs an admission and a release. Through redis-py's client each call
also takes a connection from the pool, wraps it in retry and metrics bookkeeping, puts
it back, and parses the reply with a general parser. A ``Channel`` keeps one connection
of the client's pool for the calling thread, sends a request (or several commands) in
one write, and reads the replies in order through the connection's public
``read_response`` (an error reply is kept as its exception, so the replies after it are
still read). A connection error drops the connection; the next call opens a new one.

A request may also be sent without waiting for its replies (:meth:`Channel.send`): they
are read at the channel's next call, which then finds them already there, or by
:func:`settle_all` (the lease keeper's thread, and a process that exits). Such a request
may even wait to be written until the channel's next request, and go in the same write
(``now=False``): Redis then reads both at once and answers both at once, which saves it
and this process a network exchange. Redis handles one connection's commands in order,
so a request sent either way is applied before anything this thread asks next. A task's
release is sent so.

Only plain ``redis.Redis`` clients over a ``ConnectionPool`` get a channel; any other
client (Cluster, custom pools) is called the ordinary way.

Under gevent's monkey-patching (Celery's gevent pool) ``threading.local`` is a
greenlet's, and every task runs in a greenlet of its own: a channel per greenlet would
open a connection per run, and count each against the pool's ``max_connections`` for
good. There the greenlets of an OS thread share its channels; the channel's lock (then
gevent's) makes them take turns, one request and its replies at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Set, Tuple

import redis
from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

logger = logging.getLogger(__name__)

_POOLS = (redis.ConnectionPool,)

#: What :meth:`Channel.send` does with the replies once they are read: it gets one per
#: command, in order; an error reply comes as the exception (not raised), and when the
#: connection failed before they were read, every reply is that ``RedisError``.
ReplyHandler = Callable[[List[Any]], None]


class Channel:
    """A connection of ``client``'s pool, for one thread (other threads only settle it).

    Example::

        channel = channel_for(client)
        reply = channel.call("EVALSHA", sha, 1, key, token)
        removed, mark = channel.call_many(("ZREM", key, member), ("ZSCORE", key, "#hold"))
        channel.send(("ZREM", key, member), then=lambda replies: print(replies))
        channel.send(("ZREM", key, member), then=print, now=False)  # with the next request
    """

    def __init__(self, client: Any) -> None:
        self.connection = client.connection_pool.make_connection()
        self._pool = client.connection_pool
        #: The timeout (s) set by :meth:`limit_waits`, or None: the client's own.
        self.timeout: Optional[float] = None
        kwargs = client.connection_pool.connection_kwargs
        self.encoding = kwargs.get("encoding", "utf-8")
        self.decode = bool(kwargs.get("decode_responses", False))
        self._lock = threading.Lock()
        #: Requests sent without waiting: how many replies each expects, and its handler.
        self._unread: List[Tuple[int, ReplyHandler]] = []
        #: When the oldest of them was sent (``time.monotonic()``).
        self.unread_since = 0.0
        #: Requests of :meth:`send` not written yet: they go out with the next write.
        self._outbox: List[bytes] = []

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply."""
        return self._exchange(self._pack(command), 1)[0]

    def call_many(self, *commands: Any) -> List[Any]:
        """Send several commands in one write and return their replies, in order."""
        return self._exchange(b"".join(self._pack(command) for command in commands),
                              len(commands))

    def send(self, *commands: Any, then: ReplyHandler, now: bool = True) -> None:
        """Send ``commands`` in one write, and read their replies later: at this
        channel's next call, or when it is settled. ``then`` gets the replies.

        ``now=False`` leaves the request to be written with the channel's next request,
        or when it is settled. Raises a ``RedisError`` if the request (with any left
        before it) could not be written."""
        global _last_unsettled
        request = b"".join(self._pack(command) for command in commands)
        error: Optional[RedisError] = None
        first = False
        with self._lock:
            if now:
                request = self._take_outbox(request)
                try:
                    self.connection.send_packed_command([request], check_health=False)
                except (ConnectionError, TimeoutError, OSError) as exc:
                    error = self._fail(exc)
                    pending, self._unread = self._unread, []
                    _unsettled.discard(self)
            else:
                self._outbox.append(request)
            if error is None:
                first = not self._unread
                if first:
                    self.unread_since = _last_unsettled = time.monotonic()
                    _unsettled.add(self)
                self._unread.append((len(commands), then))
        if error is None:
            if first and _unsettled_hook is not None:
                _unsettled_hook()
            return
        _hand_over([(handler, [error] * count) for count, handler in pending])
        raise error

    def limit_waits(self, seconds: float) -> None:
        """From now on, give up on the lock store after ``seconds`` (to connect, or for
        a reply) instead of the client's timeouts: the replies still owed are read,
        then a connection with those timeouts replaces the channel's."""
        if self.timeout == seconds:
            return
        self.settle()
        kwargs = {**self._pool.connection_kwargs, "socket_timeout": seconds,
                  "socket_connect_timeout": seconds}
        with self._lock:
            old, self.connection = self.connection, self._pool.connection_class(**kwargs)
            self.timeout = seconds
        old.disconnect()

    @property
    def unsettled(self) -> bool:
        """True while replies of :meth:`send` wait to be read."""
        return bool(self._unread)

    def settle(self) -> None:
        """Write what earlier :meth:`send` calls left unwritten, read their replies now
        and pass them on."""
        if self._unread:
            self._exchange(b"", 0)

    def _exchange(self, request: bytes, replies: int) -> List[Any]:
        """Write the requests that earlier :meth:`send` calls left unwritten and
        ``request`` in one write, read the replies still owed to earlier sends and then
        ``replies`` replies. The connection is redis-py's (it connects, authenticates,
        sets up TLS, parses). Handlers of earlier sends run once the lock is let go: they
        may call the lock store themselves."""
        with self._lock:
            pending, self._unread = self._unread, []
            _unsettled.discard(self)
            done: List[Tuple[ReplyHandler, List[Any]]] = []
            error: Optional[RedisError] = None
            request = self._take_outbox(request)
            try:
                if request:
                    self.connection.send_packed_command([request], check_health=False)
                for count, handler in pending:
                    done.append((handler, [self._read() for _ in range(count)]))
                answers = [self._read() for _ in range(replies)]
            except (ConnectionError, TimeoutError, OSError) as exc:
                error = self._fail(exc)
                done.extend((handler, [error] * count) for count, handler in pending[len(done):])
        _hand_over(done)
        if error is not None:
            raise error
        for answer in answers:
            if isinstance(answer, RedisError):  # ResponseError, NoScriptError, BusyLoadingError
                raise answer
        return answers

    def _take_outbox(self, request: bytes) -> bytes:
        """``request`` after the requests left unwritten, which it takes with it."""
        if not self._outbox:
            return request
        self._outbox.append(request)
        request, self._outbox = b"".join(self._outbox), []
        return request

    def _read(self) -> Any:
        """The next reply; an error reply (``ResponseError``, ``NoScriptError``) is
        returned, not raised, so that the replies after it are still read."""
        try:
            return self.connection.read_response()
        except ResponseError as error:
            return error

    def _fail(self, exc: BaseException) -> RedisError:
        """Drop the connection (and anything left to write on it) after ``exc``; the
        error to raise for it."""
        self._outbox = []
        self.connection.disconnect()
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return exc
        return ConnectionError(f"Error talking to the lock store: {exc}")

    def _pack(self, command: Any) -> bytes:
        """The command in the Redis protocol. The arguments here are short strings and
        numbers, so this skips redis-py's general packer (chunking, type dispatch)."""
        encoding = self.encoding
        data = [argument.encode(encoding) if type(argument) is str
                else b"%d" % argument if type(argument) is int
                else _encode_other(argument, encoding) for argument in command]
        return b"*%d\r\n" % len(data) + b"".join(
            [b"$%d\r\n%b\r\n" % (len(item), item) for item in data])


def _encode_other(argument: Any, encoding: str) -> bytes:
    """An argument that is neither ``str`` nor ``int`` as Redis protocol bytes."""
    if isinstance(argument, bytes):
        return argument
    if isinstance(argument, float):
        return repr(argument).encode()
    return str(argument).encode(encoding)


def _hand_over(done: List[Tuple[ReplyHandler, List[Any]]]) -> None:
    """Give read replies to their handlers; a handler that fails is logged, never raised
    into the unrelated call that happened to read its replies."""
    for handler, replies in done:
        try:
            handler(replies)
        except Exception:
            logger.exception("celery-redislock: handling a lock store reply failed")


def _thread_local() -> Any:
    """Storage of the OS thread: ``threading.local`` unless gevent patched it to be a
    greenlet's, then the original (the module docstring says why)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return monkey.get_original("threading", "local")()
    return threading.local()


_local = _thread_local()
#: Channels of this process with replies still to read (see :func:`settle_all`).
_unsettled: Set[Channel] = set()
_unsettled_hook: Optional[Callable[[], None]] = None
#: When a channel of this process last got replies to read later (``time.monotonic()``).
_last_unsettled = float("-inf")


def channel_for(client: Any) -> Optional[Channel]:
    """This thread's channel to ``client``, or None if the client cannot have one (under
    gevent, the OS thread's, shared by its greenlets)."""
    pool = getattr(client, "connection_pool", None)
    local = _local
    if getattr(local, "pool", None) is pool and pool is not None:
        channel: Optional[Channel] = local.channel
        return channel  # the pool this thread used last: the usual case
    if type(client) is not redis.Redis or type(pool) not in _POOLS:
        return None
    channels = getattr(local, "channels", None)
    if channels is None:
        # Keyed by the pool itself, weakly: an id() could be reused by a later pool.
        channels = local.channels = weakref.WeakKeyDictionary()
    channel = channels.get(pool)
    if channel is None:
        channel = channels[pool] = Channel(client)
    local.pool, local.channel = pool, channel
    return channel


def limit_waits(client: Any, seconds: float) -> bool:
    """Make this thread give up on ``client``'s lock store after ``seconds`` (to connect,
    or for a reply), for a thread that must not wait long (a worker's event loop); False
    when the client cannot have a channel (its own timeouts stay).

        >>> import redis
        >>> client = redis.Redis.from_url(redis_url, socket_timeout=10)
        >>> limit_waits(client, 1.0), channel_for(client).timeout
        (True, 1.0)
    """
    channel = channel_for(client)
    if channel is None:
        return False
    channel.limit_waits(seconds)
    return True


def when_unsettled(hook: Optional[Callable[[], None]]) -> None:
    """Call ``hook`` (in the sending thread) whenever a channel that had every reply read
    gets one to read later: the lease keeper uses it to look soon."""
    global _unsettled_hook
    _unsettled_hook = hook


def unsettled(within: float = 0.0) -> bool:
    """True if a channel of this process has replies still to read, or had some
    ``within`` seconds ago."""
    return bool(_unsettled) or time.monotonic() - _last_unsettled < within


def oldest_unsettled() -> Optional[float]:
    """When the oldest request whose replies are still to read was sent (or left to be
    written) by a channel of this process (``time.monotonic()``); None if there is none."""
    return min((channel.unread_since for channel in list(_unsettled)), default=None)


def settle_all(older_than: float = 0.0) -> None:
    """Write what this process's channels left unwritten and read the replies they
    still owe, for those whose oldest such request is at least ``older_than`` seconds
    old, and pass the replies on (see :meth:`Channel.send`)."""
    now = time.monotonic()
    for channel in list(_unsettled):
        if now - channel.unread_since >= older_than:
            with contextlib.suppress(RedisError):  # the handlers were told of it
                channel.settle()


def _forget_parent_channels() -> None:
    """A forked child makes its own connections: its parent's belong to the parent."""
    global _local, _last_unsettled
    _local = _thread_local()
    _unsettled.clear()
    _last_unsettled = float("-inf")


os.register_at_fork(after_in_child=_forget_parent_channels)
