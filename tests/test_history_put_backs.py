"""What the history check records of a moved copy put back in its parking queue: one
``restored`` event per put-back, where the worker's poll logs it
(:func:`celery_redislock.line.poll.log_put_back`, wrapped by tests/history/app.py), on a
real redis-server; the poll's warning is still logged."""

from __future__ import annotations

from typing import Any, List

import pytest

from celery_redislock.line import poll
from celery_redislock.parking import RedisParking
from celery_redislock.parking.broker import Restored

from history import app as history_app
from history.events import Recorder
from worker_app import AppUrls


class _Broker:
    """A broker whose one put-back round finds ``found``."""

    def __init__(self, found: Restored) -> None:
        self.found = found

    def restore(self, consumed: Any = ()) -> Restored:
        return self.found


@pytest.fixture
def recorded_moves(history_urls: AppUrls, monkeypatch: pytest.MonkeyPatch) -> AppUrls:
    """The history app's move records installed for this test only, recording into
    database 3 of the session's redis-server; its URLs."""
    monkeypatch.setattr(RedisParking, "move", RedisParking.move)
    monkeypatch.setattr(poll, "log_put_back", poll.log_put_back)
    monkeypatch.setattr(RedisParking, "_history_recorded", False, raising=False)
    history_app._record_moves(history_urls)
    return history_urls


def test_each_put_back_is_recorded_where_the_poll_logs_it(
        recorded_moves: AppUrls, monkeypatch: pytest.MonkeyPatch) -> None:
    warned: List[str] = []
    # The poll's own logger, not a log capture: a worker started earlier in this process
    # may have set up logging so that nothing reaches one.
    monkeypatch.setattr(poll.logger, "warning",
                        lambda message, *args: warned.append(message % args))
    poll.restore(_Broker(Restored(put_back=[("m1", "q:a"), ("m2", "q:b")], due=2)),
                 client=None)
    events = [(e["move"], e["queue"]) for e in Recorder(recorded_moves.record).history()
              if e["kind"] == "restored"]
    assert events == [("m1", "q:a"), ("m2", "q:b")]
    assert len(warned) == 2 and "(m1)" in warned[0] and "q:b" in warned[1]
