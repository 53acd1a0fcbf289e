"""Eager runs (``apply()``, ``task_always_eager``) on the parking line (``redislock_line =
"broker"``): a run inline in the caller has no message to park and no worker to move it
back, so it waits in the caller's thread, polling the lock store with backoff until it is
admitted or its ``lock_max_wait`` ends, as on the default line. It writes no line entry,
no reference and no message in the lock store, and never overtakes the parked line: a
slot freed while runs are parked is theirs first. On a real redis-server (lock store and
broker)."""

from __future__ import annotations

import threading
import time
from typing import Any, List, Set

import pytest

from celery_redislock import LimitedTask, LockWaitTimeout
from celery_redislock.engine.admission import Lease, ParkedMove, SlotLimit
from celery_redislock.engine.keys import rate_key, semaphore_key
from celery_redislock.engine.parking import due, park_admit, run_id
from celery_redislock.line import moves as line_moves

PREFIX = "redislock:"


@pytest.fixture
def app(celery_app: Any) -> Any:
    celery_app.conf.redislock_line = "broker"
    return celery_app


@pytest.fixture
def owed(monkeypatch: pytest.MonkeyPatch) -> List[ParkedMove]:
    """The moves owed by this process (instead of moving parked copies in the broker)."""
    moves: List[ParkedMove] = []
    monkeypatch.setattr(line_moves, "owe", lambda app, found: moves.extend(found))
    return moves


def keys_of(client: Any) -> Set[bytes]:
    return set(client.keys("*"))


def line_keys(client: Any) -> Set[bytes]:
    """Keys of a waiting line, of either kind: the default line's (``q``, ``w``) and the
    parking line's references and counts (``pr``, ``pn``, ``pq``)."""
    marks = (b"}:q:", b"}:w:", b"}:pr:", b"}:pn:", b":pr", b":pn", b":pq")
    return {key for key in keys_of(client) if any(mark in key for mark in marks)}


def test_an_eager_run_waits_in_place_and_writes_no_line(app: Any, lock_client: Any,
                                                         owed: List[ParkedMove]) -> None:
    @app.task(base=LimitedTask, lock_key="eager-parking", lock_max_wait=0.3, shared=False)
    def eager() -> str:
        return "ran"

    key = semaphore_key("eager-parking", PREFIX)
    limit = [SlotLimit("eager-parking", 1, PREFIX)]
    assert eager.apply().get() == "ran"
    held = park_admit(lock_client, limit, lease=30, run=run_id("worker-run", 0))
    assert isinstance(held, Lease)
    before = keys_of(lock_client)
    started = time.monotonic()
    with pytest.raises(LockWaitTimeout, match="eager-parking"):
        eager.apply().get()
    assert time.monotonic() - started < 1.5  # polled with backoff, at most its max wait
    assert keys_of(lock_client) == before and not line_keys(lock_client)  # nothing written
    # The holder ends within the wait: the eager run is admitted then, in place.
    threading.Timer(0.1, held.release).start()
    assert eager.apply().get() == "ran"
    assert not line_keys(lock_client) and not owed
    assert not lock_client.zrangebyscore(key, time.time() * 1000, "+inf")  # released


def test_an_eager_run_never_overtakes_the_parked_line(app: Any, lock_client: Any,
                                                      owed: List[ParkedMove]) -> None:
    """A run parked behind a holder: the holder's release reserves the slot for the
    parked line, the eager run keeps waiting; once the parked run has run, it is admitted.
    An eager run's release hands nothing over itself (it has no worker): the workers'
    poll hands its slot to a run parked meanwhile."""
    @app.task(base=LimitedTask, lock_key="eager-behind", lock_max_wait=0.3, shared=False)
    def eager(seconds: float = 0.0) -> str:
        time.sleep(seconds)
        return "ran"

    limit = [SlotLimit("eager-behind", 1, PREFIX)]
    key = limit[0].key
    held = park_admit(lock_client, limit, lease=30, run=run_id("holder", 0))
    parked = park_admit(lock_client, limit, lease=30, run=run_id("parked", 0))
    assert parked.park is not None
    assert held.release() and held.handoffs == [ParkedMove(key)]
    with pytest.raises(LockWaitTimeout):  # the slot is the parked run's
        eager.apply().get()
    moved = park_admit(lock_client, limit, lease=30, run=run_id("parked", 0),
                       parked=parked.park)
    assert isinstance(moved, Lease) and moved.release()
    # The line is empty: the eager run runs; a run parks while it runs.
    ran: List[str] = []
    body = threading.Thread(target=lambda: ran.append(eager.apply(args=(0.5,)).get()))
    body.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        behind = park_admit(lock_client, limit, lease=30, run=run_id("behind", 0))
        if not isinstance(behind, Lease):
            break
        behind.release()  # the eager run has not taken the slot yet
        time.sleep(0.01)
    assert behind.park is not None
    body.join(5)
    assert ran == ["ran"] and not owed
    assert due(lock_client, {key: 1}, prefix=PREFIX) == [ParkedMove(key)]


def test_an_eager_rate_limited_run_waits_for_its_start_in_place(app: Any, lock_client: Any,
                                                                 owed: List[ParkedMove]) -> None:
    @app.task(base=LimitedTask, lock_key="eager-rate", lock_rate="2/s", lock_burst=0,
              lock_max_wait=5, shared=False)
    def rated() -> float:
        return time.monotonic()

    first, second = rated.apply().get(), rated.apply().get()
    assert 0.4 <= second - first < 1.5
    assert not line_keys(lock_client) and not owed
    assert lock_client.exists(rate_key("eager-rate", PREFIX))
