"""One connection per thread for the commands on every task's path.

Every limited run costs an admission and a release. Through redis-py's client each call
also takes a connection from the pool, wraps it in retry and metrics bookkeeping, puts
it back, and parses the reply with a general parser. A ``Channel`` keeps one connection
of the client's pool for the calling thread, sends a request (or several commands) in
one write, and reads the replies itself. A connection error drops the connection; the
next call opens a new one.

Only plain ``redis.Redis`` clients over a ``ConnectionPool`` get a channel; any other
client (Cluster, custom pools) is called the ordinary way.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from typing import Any, List, Optional

import redis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError, RedisError, TimeoutError

_POOLS = (redis.ConnectionPool,)


class Channel:
    """A connection of ``client``'s pool, used by one thread only.

    Example::

        channel = channel_for(client)
        reply = channel.call("EVALSHA", sha, 1, key, token)
        removed, exists = channel.call_many(("ZREM", key, member), ("EXISTS", line))
    """

    def __init__(self, client: Any) -> None:
        self.connection = client.connection_pool.make_connection()
        kwargs = client.connection_pool.connection_kwargs
        self.encoding = kwargs.get("encoding", "utf-8")
        self.decode = bool(kwargs.get("decode_responses", False))
        self._replies = ReplyReader()

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply."""
        return self._exchange(self._pack(command), 1)[0]

    def call_many(self, *commands: Any) -> List[Any]:
        """Send several commands in one write and return their replies, in order."""
        return self._exchange(b"".join(self._pack(command) for command in commands),
                              len(commands))

    def _exchange(self, request: bytes, replies: int) -> List[Any]:
        """Write ``request``, read ``replies`` replies. The connection is redis-py's (it
        connects, authenticates, sets up TLS); the replies are read here, directly from
        its socket, which costs a fraction of redis-py's general reply parser."""
        try:
            if self.connection._sock is None:
                self.connection.connect()
                self._replies = ReplyReader()
            sock = self.connection._sock
            sock.sendall(request)
            answers = [self._replies.read(sock, self.decode) for _ in range(replies)]
        except socket.timeout as exc:
            self._drop()
            raise TimeoutError(f"Timeout reading from the lock store: {exc}") from exc
        except (ConnectionError, TimeoutError, OSError) as exc:
            self._drop()
            if isinstance(exc, (ConnectionError, TimeoutError)):
                raise
            raise ConnectionError(f"Error talking to the lock store: {exc}") from exc
        for answer in answers:
            if isinstance(answer, RedisError):  # ResponseError, NoScriptError, BusyLoadingError
                raise answer
        return answers

    def _pack(self, command: Any) -> bytes:
        """The command in the Redis protocol. The arguments here are short strings and
        numbers, so this skips redis-py's general packer (chunking, type dispatch)."""
        parts = [b"*%d\r\n" % len(command)]
        for argument in command:
            if isinstance(argument, str):
                argument = argument.encode(self.encoding)
            elif not isinstance(argument, bytes):
                argument = repr(argument).encode() if isinstance(argument, float) \
                    else str(argument).encode()
            parts.append(b"$%d\r\n%b\r\n" % (len(argument), argument))
        return b"".join(parts)

    def _drop(self) -> None:
        self.connection.disconnect()
        self._replies = ReplyReader()


class ReplyReader:
    """Reads Redis replies (RESP2 and RESP3) from a socket, with a buffer of its own.

    Error replies come back as exceptions (redis-py's classes, e.g. ``NoScriptError``),
    returned rather than raised so that the replies after them are still read::

        reader = ReplyReader()
        reply = reader.read(sock, decode=False)
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.position = 0

    def read(self, sock: Any, decode: bool) -> Any:
        line = self._line(sock)
        kind, rest = line[:1], line[1:]
        if kind == b"$" or kind == b"=":
            length = int(rest)
            if length < 0:
                return None
            data = self._exactly(sock, length + 2)[:-2]
            if kind == b"=":
                data = data[4:]  # verbatim string: "txt:" or "mkd:" first
            return data.decode() if decode else data
        if kind == b":" or kind == b"(":
            return int(rest)
        if kind == b"*" or kind == b"~" or kind == b">":
            count = int(rest)
            return None if count < 0 else [self.read(sock, decode) for _ in range(count)]
        if kind == b"+":
            return rest.decode() if decode else rest
        if kind == b"-" or kind == b"!":
            message = rest if kind == b"-" else self._exactly(sock, int(rest) + 2)[:-2]
            return BaseParser.parse_error(message.decode("utf-8", "replace"))
        if kind == b"_":
            return None
        if kind == b"#":
            return rest == b"t"
        if kind == b",":
            return float(rest)
        if kind == b"%":
            count = int(rest)
            answer = {}
            for _ in range(count):
                field = self.read(sock, decode)
                answer[field] = self.read(sock, decode)
            return answer
        if kind == b"|":  # attributes come before the reply they describe
            for _ in range(2 * int(rest)):
                self.read(sock, decode)
            return self.read(sock, decode)
        raise ConnectionError(f"Protocol error from the lock store: {bytes(line)!r}")

    def _line(self, sock: Any) -> bytes:
        while True:
            end = self.buffer.find(b"\r\n", self.position)
            if end >= 0:
                line = bytes(self.buffer[self.position:end])
                self.position = end + 2
                return line
            self._fill(sock)

    def _exactly(self, sock: Any, count: int) -> bytes:
        while len(self.buffer) - self.position < count:
            self._fill(sock)
        data = bytes(self.buffer[self.position:self.position + count])
        self.position += count
        return data

    def _fill(self, sock: Any) -> None:
        if self.position:
            del self.buffer[:self.position]
            self.position = 0
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("The lock store closed the connection")
        self.buffer += chunk



_local = threading.local()


def channel_for(client: Any) -> Optional[Channel]:
    """This thread's channel to ``client``, or None if the client cannot have one."""
    pool = getattr(client, "connection_pool", None)
    if type(client) is not redis.Redis or type(pool) not in _POOLS:
        return None
    channels = getattr(_local, "channels", None)
    if channels is None or _local.pid != os.getpid():
        # Keyed by the pool itself, weakly: an id() could be reused by a later pool.
        channels = _local.channels = weakref.WeakKeyDictionary()
        _local.pid = os.getpid()
    channel = channels.get(pool)
    if channel is None:
        channel = channels[pool] = Channel(client)
    return channel
