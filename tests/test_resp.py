"""The RESP2 parser and the pipeline of the async gate (:mod:`celery_redislock.engine.resp`),
and the ``redislock_gate`` setting."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery

from celery_redislock.config.settings import read_settings
from celery_redislock.engine import resp
from celery_redislock.engine.resp import ErrorReply, Parser, Pipeline, pack
from celery_redislock.errors import LockConfigurationError

ADMIT_REPLIES = (b"$19\r\n1700000000000 17000\r\n"
                 b"*9\r\n:0\r\n:1700\r\n:1\r\n:2\r\n:-1\r\n:-1\r\n:3\r\n$3\r\nmsg\r\n*0\r\n"
                 b"-NOSCRIPT No matching script\r\n$-1\r\n*-1\r\n+OK\r\n")


@pytest.fixture(autouse=True, params=["hiredis", "python"])
def _parser_kind(request: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: with hiredis's packer and parser (when installed), and with the
    pure-Python ones."""
    if request.param == "python":
        monkeypatch.setattr(resp, "_Reader", None)
        monkeypatch.setattr(resp, "_pack_command", None)


def test_packed_as_the_pure_python_packer_packs() -> None:
    for args in [("GET", "k"), ("EVALSHA", "ab", 2, b"k", "\u00e9", 1.5, -3, 10 ** 20),
                 ("X", True, None)]:
        assert pack(*args) == resp._pack(args)


def test_replies_cut_anywhere_come_out_whole_and_in_order() -> None:
    expected = Parser()
    expected.feed(ADMIT_REPLIES)
    whole = expected.replies()
    assert whole == [b"1700000000000 17000", [0, 1700, 1, 2, -1, -1, 3, b"msg", []],
                     ErrorReply("NOSCRIPT No matching script"), None, None, b"OK"]
    for cut in range(1, len(ADMIT_REPLIES)):
        parser = Parser()
        parser.feed(ADMIT_REPLIES[:cut])
        got = parser.replies()
        parser.feed(ADMIT_REPLIES[cut:])
        assert got + parser.replies() == whole


def test_decoded_replies_are_text() -> None:
    parser = Parser(decode=True)
    parser.feed(b"*2\r\n$2\r\nab\r\n:5\r\n")
    assert parser.replies() == [["ab", 5]]


def test_a_real_server_reads_what_is_packed(redis_client: Any) -> None:
    connection = socket_of(redis_client)
    connection.sendall(pack("SET", "resp:k", "é 1") + pack("GET", "resp:k") + pack("NOPE"))
    parser, replies = Parser(), list()
    while len(replies) < 3:
        parser.feed(connection.recv(4096))
        replies += parser.replies()
    assert replies[:2] == [b"OK", "é 1".encode()]
    assert isinstance(replies[2], ErrorReply)


def socket_of(client: Any) -> Any:
    import socket
    kwargs = client.connection_pool.connection_kwargs
    return socket.create_connection((kwargs["host"], kwargs["port"]), 5)


def test_asks_queued_behind_one_in_flight_go_in_one_write() -> None:
    line, got = Pipeline(), list()
    assert line.queue(b"a", got.append, ask=True, now=0.0)
    assert line.take() == b"a"
    assert not line.queue(b"b", got.append, ask=True, now=0.1)
    assert not line.queue(b"r", got.append, ask=False, now=0.1)
    assert not line.queue(b"c", got.append, ask=True, now=0.2)
    assert not line.due() and line.overdue(1.2, 1.0) and not line.overdue(0.9, 1.0)
    for then, reply in line.answered(["A"]):
        then(reply)
    assert line.due() and line.take() == b"brc"
    for then, reply in line.answered(["B", "R", "C"]):
        then(reply)
    assert got == ["A", "B", "R", "C"] and not line.pending and not line.due()


def test_a_failure_answers_everything_queued_or_in_flight() -> None:
    line, got = Pipeline(), list()
    line.queue(b"a", got.append, ask=True, now=0.0)
    line.take()
    line.queue(b"b", got.append, ask=True, now=0.0)
    error = redis.TimeoutError("late")
    for then, reply in line.fail(error):
        then(reply)
    assert got == [error, error]
    assert line.queue(b"c", got.append, ask=True, now=1.0)  # nothing in flight now


@pytest.mark.parametrize("value, expected", [(None, "async"), ("blocking", "blocking"),
                                             ("async", "async")])
def test_the_gate_setting(value: Any, expected: str) -> None:
    app = Celery(set_as_current=False)
    if value is not None:
        app.conf.redislock_gate = value
    assert read_settings(app).gate == expected


def test_a_wrong_gate_setting_is_refused() -> None:
    app = Celery(set_as_current=False)
    app.conf.redislock_gate = "nonblocking"
    with pytest.raises(LockConfigurationError, match="redislock_gate"):
        read_settings(app)
