"""The event loop's script reply (``_ScriptReply`` in
:mod:`celery_redislock.engine.hub_store`) against a Redis 6.2 as it answers: a script
unknown to the server (``NOSCRIPT``) is sent whole; the server's compiler refuses its
``#!lua`` flags line, so it is sent once more without it, and runs; and a script the
server never takes is answered with an error after a bounded number of sends, never
sent again and again.

The server is the real redis-server behind a small proxy that answers as Redis 6.2 does
where a newer server would not: it refuses to compile an ``EVAL`` whose script starts
with ``#!lua`` (the error text is Redis 6.2's), and passes every other command on. Every
command the connection sent is recorded in order.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator, List

import pytest
import redis
from kombu.asynchronous import Hub

from celery_redislock.engine.hub_store import HubStore
from celery_redislock.engine.resp import ErrorReply, Parser, pack
from celery_redislock.engine.scripts import LuaScript

#: What Redis 6.2 answers to a script whose first line is ``#!lua``.
FLAGS_REFUSED = ("ERR Error compiling script (new function): user_script:1: "
                 "unexpected symbol near '#'")


class Redis62:
    """A listening socket in front of the real server ``upstream`` (host, port): one
    connection at a time, each command answered in order. ``never_known``: every
    ``EVALSHA`` and ``EVAL`` is answered ``NOSCRIPT`` (a server that never keeps the
    script)."""

    def __init__(self, upstream: Any, never_known: bool = False) -> None:
        self.upstream, self.never_known = upstream, never_known
        #: Every command received, in order (its name upper-cased, then its arguments).
        self.commands: List[List[bytes]] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=5)

    def sent(self) -> List[List[bytes]]:
        """The commands received so far: name and first argument (a script or its sha)."""
        return [command[:2] for command in self.commands]

    def _serve(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:  # closed before any connection
            return
        with client, socket.create_connection(self.upstream) as server:
            commands, replies = Parser(), Parser()
            while True:
                data = client.recv(1 << 16)
                if not data:
                    return
                commands.feed(data)
                for command in commands.replies():
                    command = [command[0].upper(), *command[1:]]
                    self.commands.append(command)
                    client.sendall(_encode(self._answer(command, server, replies)))

    def _answer(self, command: List[bytes], server: socket.socket, replies: Parser) -> Any:
        name = command[0]
        if name in (b"EVAL", b"EVALSHA") and self.never_known:
            return ErrorReply("NOSCRIPT No matching script. Please use EVAL.")
        if name == b"EVAL" and command[1].startswith(b"#!lua"):
            return ErrorReply(FLAGS_REFUSED)
        server.sendall(pack(*command))
        while True:
            done = replies.replies()
            if done:
                return done[0]
            replies.feed(server.recv(1 << 16))


def _encode(reply: Any) -> bytes:
    """``reply`` in RESP2, as a server writes it."""
    if isinstance(reply, ErrorReply):
        return b"-%s\r\n" % str(reply).encode()
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, list):
        return b"*%d\r\n" % len(reply) + b"".join(_encode(item) for item in reply)
    data = reply if isinstance(reply, bytes) else str(reply).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


def proxy(redis_client: Any, **options: Any) -> Iterator[Redis62]:
    kwargs = redis_client.connection_pool.connection_kwargs
    server = Redis62((kwargs.get("host", "127.0.0.1"), kwargs["port"]), **options)
    yield server
    server.close()


@pytest.fixture
def redis62(redis_client: Any) -> Iterator[Redis62]:
    yield from proxy(redis_client)


@pytest.fixture
def forgetful(redis_client: Any) -> Iterator[Redis62]:
    yield from proxy(redis_client, never_known=True)


def run_until(hub: Hub, done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Turn the event loop until ``done()``; fail after ``timeout`` seconds."""
    loop, deadline = hub.create_loop(), time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the event loop did not get there in time"
        next(loop)


def fresh_script(source: str = "return {KEYS[1], ARGV[1]}") -> LuaScript:
    """A script no server knows yet (its text is new: a comment of its own)."""
    return LuaScript("reply_test.lua", f"-- {uuid.uuid4().hex}\n{source}")


def ask(hub: Hub, store: HubStore, script: LuaScript, key: str, arg: Any) -> Any:
    """Run ``script`` on ``store`` through the event loop; its reply, or the error."""
    got: List[Any] = []
    store.run_script(script, [key], [arg], got.append)
    run_until(hub, lambda: bool(got))
    assert len(got) == 1
    return got[0]


def test_noscript_then_the_flags_line_refused_sends_the_plain_form_once_and_runs(
        hub: Hub, redis62: Redis62) -> None:
    client = redis.Redis(port=redis62.port)
    script = fresh_script()
    store = HubStore(hub, client, deadline=5.0)

    assert ask(hub, store, script, "k", 1) == [b"k", b"1"]
    assert redis62.sent() == [
        [b"EVALSHA", script.sha.encode()],              # not known: NOSCRIPT
        [b"EVAL", script.source.encode()],              # the #!lua line refused
        [b"EVAL", script.plain_source.encode()],        # the plain form runs
    ]

    # From now on the connection pool is known to be Redis 6.2: the plain script's sha,
    # which the server now caches, in one round trip.
    del redis62.commands[:]
    assert ask(hub, store, script, "k2", 2) == [b"k2", b"2"]
    assert redis62.sent() == [[b"EVALSHA", script.plain_sha.encode()]]


def test_a_plain_form_the_server_refuses_too_is_answered_with_the_error(
        hub: Hub, redis62: Redis62) -> None:
    client = redis.Redis(port=redis62.port)
    script = fresh_script("return {")  # not Lua: the real server refuses it too
    store = HubStore(hub, client, deadline=5.0)

    reply = ask(hub, store, script, "k", 1)
    assert isinstance(reply, redis.ResponseError)
    assert "Error compiling script" in str(reply)
    assert [name for name, _ in redis62.sent()] == [b"EVALSHA", b"EVAL", b"EVAL"]


def test_a_server_that_never_keeps_the_script_is_not_asked_forever(
        hub: Hub, forgetful: Redis62) -> None:
    client = redis.Redis(port=forgetful.port)
    script = fresh_script()
    store = HubStore(hub, client, deadline=5.0)

    reply = ask(hub, store, script, "k", 1)
    assert isinstance(reply, redis.ResponseError) and "NOSCRIPT" in str(reply)
    # The EVALSHA, then the script whole twice at most; then the error goes to the caller.
    assert [name for name, _ in forgetful.sent()] == [b"EVALSHA", b"EVAL", b"EVAL"]
    # Nothing more is sent for that call: a PING after it is the next command.
    pinged: List[Any] = []
    store.send(pack("PING"), pinged.append)
    run_until(hub, lambda: bool(pinged))
    assert [command[0] for command in forgetful.commands[3:]] == [b"PING"]
