"""The parking line's poll over many keys: each worker's poll visits the slots' lines of
up to ``POLL_KEYS`` keys every ``POLL`` seconds, and over more keys less often, so that
the lock store's and the broker's work while lines are parked stays bounded however
many keys have one (it grew with them: 2,000 runs parked over 10,000 keys cost the
lock store ~92,000 commands a second and the broker ~15,000, one key ~160 and ~40;
``benchmarks/bench_line.py``). Rate limits' lines, whose runs start when the poll finds
their promised start due, are asked at every poll."""

from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List

import pytest
import redis

from celery_redislock.engine import parking as store
from celery_redislock.engine import parking_rate
from celery_redislock.engine.admission import Busy, SlotLimit
from celery_redislock.line import moves as line_moves
from celery_redislock.line import poll as line_poll
from celery_redislock.parking import Restored, parking_queue

PREFIX = "redislock:"


class _Broker:
    """The broker's side of ``keys``' lines: one message parked in each queue."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.queues = {parking_queue(key): key for key in keys}

    def registry(self, max_age: float = 0.0) -> Dict[str, str]:
        return dict(self.queues)

    def lengths(self, queues: Iterable[str]) -> Dict[str, int]:
        return {queue: 1 if queue in self.queues else 0 for queue in queues}

    def restore(self, limit: int = 0, consumed: Iterable[str] = ()) -> Restored:
        return Restored()


def _park_lines(client: redis.Redis, count: int) -> List[str]:
    """``count`` keys of one slot, each held, each with one run parked in its line."""
    keys = []
    for i in range(count):
        limit = [SlotLimit(f"pace{i}", 1, PREFIX)]
        assert not isinstance(store.park_admit(client, limit, lease=60, run=f"h{i}:0"), Busy)
        assert isinstance(store.park_admit(client, limit, lease=60, run=f"w{i}:0"), Busy)
        keys.append(limit[0].key)
    return keys


def _app(url: str) -> Any:
    from celery import Celery
    app = Celery("pace", set_as_current=False)
    app.conf.update(redislock_url=url, redislock_line="broker")
    return app


@pytest.fixture
def visits(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List[int]]:
    """How many keys each call of the store's ``due`` and ``due_rate`` was given (the
    calls go through; the moves owed are dropped)."""
    seen: Dict[str, List[int]] = {"due": [], "due_rate": []}
    due, due_rate = store.due, parking_rate.due_rate

    def counted_due(client: Any, lengths: Dict[str, int], **kw: Any) -> Any:
        seen["due"].append(len(lengths))
        return due(client, lengths, **kw)

    def counted_due_rate(client: Any, lengths: Dict[str, int], **kw: Any) -> Any:
        seen["due_rate"].append(len(lengths))
        return due_rate(client, lengths, **kw)

    monkeypatch.setattr(store, "due", counted_due)
    monkeypatch.setattr(parking_rate, "due_rate", counted_due_rate)
    monkeypatch.setattr(line_moves, "owe", lambda app, owed: None)
    return seen


def test_a_poll_over_many_keys_visits_their_lines_less_often(
        redis_client: redis.Redis, redis_server: Any, visits: Dict[str, List[int]]) -> None:
    """300 keys with a line: a poll visits all of them, and the polls of the next
    0.4 s (``pause_after(300)`` less one ``POLL``) do not; then one does again."""
    keys = _park_lines(redis_client, 300)
    poll, broker = line_poll.Poll(_app(redis_server.url)), _Broker(keys)
    poll.once(broker)
    after = time.monotonic()
    assert visits["due"] == [300]
    poll.once(broker)
    assert visits["due"] == [300]  # too soon: not visited again
    assert poll.next_visit - after == pytest.approx(
        line_poll.pause_after(300) - line_poll.POLL, abs=0.1)
    due, deadline = poll.next_visit, poll.next_visit + 10.0
    while len(visits["due"]) < 2:  # the poll's own pace, not a sleep
        assert time.monotonic() < deadline, "the lines were not visited again"
        started = time.monotonic()
        poll.once(broker)
        if len(visits["due"]) < 2:  # a poll begun once it was due would have visited
            assert started < due
    assert time.monotonic() >= due  # never early
    assert visits["due"] == [300, 300]


def test_a_poll_over_few_keys_visits_them_every_time(
        redis_client: redis.Redis, redis_server: Any, visits: Dict[str, List[int]]) -> None:
    """Up to ``POLL_KEYS`` keys, every poll visits every line, as before."""
    keys = _park_lines(redis_client, line_poll.POLL_KEYS)
    poll, broker = line_poll.Poll(_app(redis_server.url)), _Broker(keys)
    poll.once(broker)
    poll.once(broker)
    assert visits["due"] == [line_poll.POLL_KEYS] * 2
    assert line_poll.pause_after(line_poll.POLL_KEYS) == line_poll.POLL


def test_rate_lines_are_asked_at_every_poll(
        redis_client: redis.Redis, redis_server: Any, visits: Dict[str, List[int]]) -> None:
    """Between two visits of every line, a poll still asks the rate limits' lines."""
    keys = _park_lines(redis_client, 300)
    rate_key = "redislock:{pace}:r:rate"
    redis_client.zadd(store.rate_index(PREFIX), {rate_key: 1})
    poll, broker = line_poll.Poll(_app(redis_server.url)), _Broker([*keys, rate_key])
    poll.once(broker)
    poll.once(broker)
    assert visits["due"] == [300] and visits["due_rate"] == [1, 1]


def test_a_visit_asks_the_store_in_short_scripts(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script holds the lock store for its whole run: a visit of 120 keys is three
    scripts of at most ``DUE_BATCH`` keys each (500 keys in one held the store 28-68 ms,
    every other client waiting), and hands over as one would."""
    keys = _park_lines(redis_client, 120)
    sent: List[int] = []
    due = store.DUE

    class _Counted:
        def run(self, client: Any, keys: List[str], args: List[Any]) -> Any:
            sent.append(len(keys) - 1)  # the last key is the index
            return due.run(client, keys, args)

    monkeypatch.setattr(store, "DUE", _Counted())
    assert store.due(redis_client, {key: 1 for key in keys}) == []  # every slot held
    assert sent == [store.DUE_BATCH, store.DUE_BATCH, 120 - 2 * store.DUE_BATCH]


def test_a_refused_keep_late_does_not_stop_the_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script that keeps late copies' reservations refused (an ACL user without
    HSETNX): the put-back round still ends, the refusal is logged, nothing is raised."""
    class _Late(_Broker):
        def restore(self, limit: int = 0, consumed: Iterable[str] = ()) -> Restored:
            return Restored(late=[("m1", "redislock:k")], due=1)

    def refused(client: Any, late: Any, presumed: Any = ()) -> None:
        raise redis.ResponseError("NOPERM this user has no permissions to run 'hsetnx'")

    warned: List[str] = []
    monkeypatch.setattr(line_poll, "keep_late", refused)
    # The poll's own logger, not the root's: a worker started earlier in this process
    # may have set up logging so that nothing reaches a log capture.
    monkeypatch.setattr(line_poll.logger, "warning",
                        lambda message, *args: warned.append(message % args))
    line_poll.restore(_Late([]), None)
    assert len(warned) == 1 and "reservations were not kept" in warned[0]
