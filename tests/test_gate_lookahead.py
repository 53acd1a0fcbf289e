"""The async gate's look-ahead (``gate/room.py``): while a task's key has slots to
spare, a prefork worker asks for up to as many runs beyond its free pool processes as it
has processes; a run asked for so that finds a line, or takes the last free slot, with
still no process free, gives its slot back and waits for a process."""

from __future__ import annotations

from typing import Any, Iterator, List

import pytest
from celery.worker import state as worker_state

from celery_redislock.gate import room as gate_room


class _Prefork:
    __module__ = "celery.concurrency.prefork"
    num_processes = 2


class _Consumer:
    hub = object()
    pool = _Prefork()


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name


class _Message:
    def __init__(self, headers: Any) -> None:
        self.headers = headers


class _Request:
    def __init__(self, task: str, headers: Any = None) -> None:
        self.task = _Task(task)
        self.message = _Message(headers or {})


@pytest.fixture
def reserved() -> Iterator[List[Any]]:
    """Requests reserved by the worker (taken out again afterwards)."""
    added: List[Any] = []
    yield added
    for request in added:
        worker_state.reserved_requests.discard(request)
    gate_room.spare.clear()


def _queue(consumer: Any, reserved: List[Any], busy: int, waiting: List[str]) -> gate_room.Room:
    """``busy`` requests in the pool, and ``waiting`` held in the room, in order."""
    room = gate_room.Room()
    for number in range(busy):
        request = _Request(f"busy-{number}")
        reserved.append(request)
        worker_state.reserved_requests.add(request)
    for name in waiting:
        request, hold = _Request(name), gate_room.Hold()
        reserved.append(request)
        worker_state.reserved_requests.add(request)
        gate_room.held[request] = hold
        room.queue.append((request, lambda request: None, hold))
    return room


def test_a_key_with_slots_to_spare_is_asked_for_ahead(reserved: List[Any]) -> None:
    """Both processes busy: nothing is taken while the task has not been seen with slots
    to spare; with them, two more (the look-ahead of a two-process pool), no more."""
    consumer = _Consumer()
    room = _queue(consumer, reserved, busy=2, waiting=["t"] * 4)
    try:
        assert gate_room.lookahead(consumer) == 2
        with gate_room.held_lock:
            assert gate_room.take_from(consumer, room) == []
        gate_room.spare["t"] = True
        with gate_room.held_lock:
            taken = gate_room.take_from(consumer, room)
        assert len(taken) == 2 and len(room.queue) == 2
    finally:
        for request, _, _ in [*room.queue, *taken]:
            gate_room.held.pop(request, None)


def test_the_look_ahead_stops_at_a_task_without_slots_to_spare(reserved: List[Any]) -> None:
    """A free process takes the head whatever its key; beyond it, the look-ahead stops
    at the first run whose task was last seen contended (the order is kept)."""
    consumer = _Consumer()
    room = _queue(consumer, reserved, busy=1, waiting=["spare", "contended", "spare"])
    gate_room.spare.update(spare=True, contended=False)
    try:
        with gate_room.held_lock:
            taken = gate_room.take_from(consumer, room)
        assert [request.task.name for request, _, _ in taken] == ["spare"]
    finally:
        for request, _, _ in [*room.queue, *taken]:
            gate_room.held.pop(request, None)


@pytest.mark.parametrize("answer, spare", [
    ({"contended": False, "last": False, "parts": []}, True),
    ({"contended": True, "last": False, "parts": []}, False),
    ({"contended": False, "last": True, "parts": []}, False),
    (None, False),
])
def test_only_an_admission_with_slots_to_spare_lets_the_next_runs_ahead(
        reserved: List[Any], answer: Any, spare: bool) -> None:
    class _Limits:
        rules: List[Any] = []

    task = _Task("noted")
    task._redislock_settings = type("S", (), {"gate": "async"})()  # type: ignore[attr-defined]
    assert gate_room.note_spare(_Consumer(), task, _Limits(), answer) is spare  # type: ignore[arg-type]
    assert gate_room.spare["noted"] is spare
    task._redislock_settings = type("S", (), {"gate": "blocking"})()  # type: ignore[attr-defined]
    assert gate_room.note_spare(_Consumer(), task, _Limits(), answer) is False  # type: ignore[arg-type]


def test_a_copy_of_a_waiting_run_is_never_asked_for_ahead() -> None:
    """A moved or sent-back copy may claim a reservation: it waits for a free process."""
    gate_room.spare["t"] = True
    try:
        for request, ahead in ((_Request("t"), True), (_Request("other"), False),
                               (_Request("t", {"redislock_wait": {"attempts": 1}}), False)):
            hold = gate_room.hold_of(request, None)  # the copy flag read from its headers
            assert gate_room.may_go_ahead(request, hold) is ahead
    finally:
        gate_room.spare.clear()


def test_no_look_ahead_without_a_prefork_pool() -> None:
    solo = type("Consumer", (), {"hub": object(), "pool": type(
        "TaskPool", (), {"__module__": "celery.concurrency.solo", "num_processes": 1})()})()
    assert gate_room.lookahead(solo) == 0
    assert gate_room.lookahead(type("Consumer", (), {"hub": None, "pool": _Prefork()})()) == 0
