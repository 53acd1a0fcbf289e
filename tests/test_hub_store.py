"""The lock store's connection on the worker's event loop
(:mod:`celery_redislock.engine.hub_store`), driven by a real kombu ``Hub`` against a
real redis-server, and a listening socket that never answers."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, Iterator, List

import pytest
import redis
from kombu.asynchronous import Hub

from celery_redislock.engine.hub_store import HubStore
from celery_redislock.engine.resp import pack
from celery_redislock.engine.scripts import LuaScript
from celery_redislock.gate.hub_store import unsupported

ECHO = LuaScript("echo_test.lua", "return {KEYS[1], ARGV[1]}")


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


def run_until(hub: Hub, done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Turn the event loop until ``done()``; fail after ``timeout`` seconds."""
    loop, deadline = hub.create_loop(), time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the event loop did not get there in time"
        next(loop)


def test_a_script_unknown_to_the_server_is_sent_whole_once(hub: Hub, redis_client: Any
                                                           ) -> None:
    redis_client.script_flush()
    store = HubStore(hub, redis_client, deadline=5.0)
    got: List[Any] = []
    for number in range(3):  # the second and third are batched behind the first
        store.run_script(ECHO, [f"k{number}"], [number], got.append)
    run_until(hub, lambda: len(got) == 3)
    assert got == [[b"k0", b"0"], [b"k1", b"1"], [b"k2", b"2"]]
    assert redis_client.script_exists(ECHO.sha) == [True]


def test_asks_that_get_no_reply_fail_at_their_deadline_and_the_loop_goes_on(
        hub: Hub) -> None:
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        client = redis.Redis(port=silent.getsockname()[1])
        store = HubStore(hub, client, deadline=0.2)
        got: List[Any] = []
        failed: List[float] = []
        ticks: List[float] = []
        hub.call_repeatedly(0.01, lambda: ticks.append(time.monotonic()))

        def answered(reply: Any) -> None:
            got.append(reply)
            failed.append(time.monotonic())

        started = time.monotonic()
        store.send(pack("PING"), answered)
        store.send(pack("PING"), answered)
        run_until(hub, lambda: len(got) == 2)
        assert all(isinstance(reply, redis.TimeoutError) for reply in got)
        assert min(failed) - started >= 0.2
        # The loop kept turning meanwhile: its timer (due every 10 ms, before the deadline
        # check's) fired while the asks waited, however few times a loaded machine lets it.
        assert any(started < tick < min(failed) for tick in ticks), (ticks, failed)
        assert store.sock is None


def test_a_store_that_cannot_be_reached_fails_the_ask(hub: Hub, closed_port: int) -> None:
    store = HubStore(hub, redis.Redis(port=closed_port), deadline=5.0)
    got: List[Any] = []
    store.send(pack("PING"), got.append)
    run_until(hub, lambda: bool(got))
    assert isinstance(got[0], redis.ConnectionError)


class _Pool:
    __module__ = "celery.concurrency.thread"


class _Consumer:
    def __init__(self, hub: Any, pool: Any) -> None:
        self.hub, self.pool = hub, pool


def test_what_cannot_be_driven_says_why(hub: Hub) -> None:
    plain = redis.Redis()
    assert "no event loop" in unsupported(_Consumer(None, None), plain)
    assert "thread pool" in unsupported(_Consumer(hub, _Pool()), plain)
    prefork = type("TaskPool", (), {"__module__": "celery.concurrency.prefork"})()
    assert unsupported(_Consumer(hub, prefork), plain) is None
    assert "TLS" in unsupported(_Consumer(hub, prefork),
                                         redis.Redis.from_url("rediss://localhost"))


def test_a_slot_taken_ahead_is_given_back(hub: Hub, redis_client: Any) -> None:
    """``give_back`` runs ``release.lua`` for a lease that took the last free slot (which
    an uncontended release does not take): the slot is free again at once; a lease in
    parts is not given back so."""
    from celery_redislock.engine.admission import Busy, Lease, SlotLimit, admit

    limit = SlotLimit("hub-give-back", 1, "redislock:")
    handed = admit(redis_client, [limit], lease=30, reserve_ms=5000).handover()
    assert handed["last"]
    assert isinstance(admit(redis_client, [limit], lease=30, probe=True), Busy)
    store = HubStore(hub, redis_client, deadline=5.0)
    published: List[Any] = []
    assert store.give_back(handed, published.extend)
    run_until(hub, lambda: not store.pipeline.pending)
    assert isinstance(admit(redis_client, [limit], lease=30), Lease)
    assert published == []
    assert store.give_back({**handed, "parts": [handed]}, published.extend) is False
