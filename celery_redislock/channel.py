"""One connection per thread for the commands on every task's path, and releases that do
not wait for their reply.

Every limited run costs an admission and a release. Through redis-py's client each call
also takes a connection from the pool, wraps it in retry and metrics bookkeeping, and
puts it back; and the release waits for a reply the run does not need. A ``Channel``
keeps one connection of the client's pool for the calling thread, and sends the release
with ``CLIENT REPLY SKIP`` in front of it: one write, no reply to wait for or to read. A
connection error drops the connection; the next call opens a new one.

Only plain ``redis.Redis`` clients over a ``ConnectionPool`` get a channel; any other
client (Cluster, custom pools) is called the ordinary way.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Optional

import redis
from redis.exceptions import ConnectionError, TimeoutError

_POOLS = (redis.ConnectionPool,)


class Channel:
    """A connection of ``client``'s pool, used by one thread only.

    Example::

        channel = channel_for(client)
        reply = channel.call("EVALSHA", sha, 1, key, token)
        channel.send("ZREM", key, member)     # sent now; the server sends no reply
    """

    def __init__(self, client: Any) -> None:
        self.connection = client.connection_pool.make_connection()
        self.encoding = client.connection_pool.connection_kwargs.get("encoding", "utf-8")

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply."""
        try:
            self.connection.send_packed_command([self._pack(command)], check_health=False)
            return self.connection.read_response()
        except (ConnectionError, TimeoutError, OSError):
            self._drop()
            raise

    def call_many(self, *commands: Any) -> list:
        """Send several commands in one write and return their replies, in order."""
        try:
            self.connection.send_packed_command(
                [b"".join(self._pack(command) for command in commands)], check_health=False)
            return [self.connection.read_response() for _ in commands]
        except (ConnectionError, TimeoutError, OSError):
            self._drop()
            raise

    def send(self, *command: Any) -> None:
        """Send ``command`` and have the server send no reply (``CLIENT REPLY SKIP``):
        nothing to wait for, and nothing to read later."""
        try:
            self.connection.send_packed_command([_SKIP_REPLY + self._pack(command)],
                                                check_health=False)
        except (ConnectionError, TimeoutError, OSError):
            self._drop()
            raise

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


#: ``CLIENT REPLY SKIP``, packed: the server sends no reply to the command after it.
_SKIP_REPLY = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$4\r\nSKIP\r\n"

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
