"""After a move that found its parking queue empty, the mover's callback gives the
reservation back (``moved_nothing``): a lock store that did not answer, or refused, is
logged and the reservation lapses (the poll hands it over again); anything else is a
bug, left to the mover, which logs it with its traceback."""

from __future__ import annotations

import logging
from typing import Any, List

import pytest
from celery import Celery
from redis.exceptions import ConnectionError, NoPermissionError

from celery_redislock.engine import parking as store
from celery_redislock.engine.standby import StandbyMove
from celery_redislock.line import moves
from celery_redislock.parking import Done, Outcome

KEY = "redislock:{x}:s:moved"


def app() -> Celery:
    celery = Celery("moved", set_as_current=False)
    celery.conf.update(redislock_url="redis://127.0.0.1:1/0", redislock_line="broker")
    return celery


def empty() -> Done:
    return Done("move", "j", "q", Outcome(False, "empty"))


class _Mover:
    """A mover whose every move finds its parking queue empty, at once."""

    def move(self, queue: str, callback: Any) -> bool:
        callback(empty())
        return True


@pytest.mark.parametrize("error", [ConnectionError("Connection refused"),
                                   NoPermissionError("no permissions to run 'evalsha'")])
def test_a_store_error_is_logged_and_the_reservation_lapses(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        error: Exception) -> None:
    def fails(client: Any, key: str, sub: str = "", reserved: bool = True) -> bool:
        raise error

    monkeypatch.setattr(store, "moved_nothing", fails)
    with caplog.at_level(logging.WARNING):
        moves._moved(app(), KEY, False, empty())
    assert any("could not give back a reservation" in record.getMessage()
               for record in caplog.records)


def test_any_other_error_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(client: Any, key: str, sub: str = "", reserved: bool = True) -> bool:
        raise TypeError("a bug")

    monkeypatch.setattr(store, "moved_nothing", broken)
    with pytest.raises(TypeError):
        moves._moved(app(), KEY, False, empty())


def test_an_empty_queue_gives_the_reservation_back(monkeypatch: pytest.MonkeyPatch) -> None:
    given_back: List[str] = []
    monkeypatch.setattr(store, "moved_nothing",
                        lambda client, key, sub="", reserved=True: given_back.append(key) or True)
    moves._moved(app(), KEY, False, empty())
    assert given_back == [KEY]


def test_a_move_taken_from_a_sub_line_counts_that_sub_line_less(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A move owed from the line's own queue, done from a sub-line the poll saw holding
    messages: that sub-line counts one copy less in the lock store."""
    took: List[Any] = []
    monkeypatch.setattr(store, "took_from_sub_line",
                        lambda client, key, sub: took.append((key, sub)) or True)
    done = Done("move", "j", "q", Outcome(True, "moved"))
    moves._moved(app(), KEY, False, done, tried=1, took=f"{KEY}\x1ftenant:a")
    assert took == [(KEY, "tenant:a")]


def test_an_empty_standby_move_gives_back_no_reservation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby's move had no slot reserved: its empty queue gives back its sub-line's
    count only (another move's reservation is not its to give)."""
    called: List[Any] = []
    monkeypatch.setattr(store, "moved_nothing", lambda client, key, sub="", reserved=True:
                        called.append((key, sub, reserved)) or False)
    monkeypatch.setattr(moves, "mover", lambda app: _Mover())
    moves.owe(app(), [StandbyMove(KEY, "tenant:a")])
    assert called == [(KEY, "tenant:a", False)]
