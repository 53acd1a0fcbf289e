"""The worker's main process's note of the requests a pool process accepted
(``gate/recovery.py``: ``_accepted``), which says which process runs a run whose slots
the main process took: a weak reference per task id, the dead ones swept in bulk once
past a bound. No worker, no server."""

from __future__ import annotations

import gc
import os
from typing import Iterator

import pytest

from celery_redislock.gate import recovery


class _Request:
    def __init__(self, task_id: str, pid: int) -> None:
        self.id, self.worker_pid = task_id, pid


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    saved, bound = dict(recovery._accepted), recovery._accepted_bound[0]
    recovery._accepted.clear()
    yield
    recovery._accepted.clear()
    recovery._accepted.update(saved)
    recovery._accepted_bound[0] = bound


def test_a_live_accepted_request_names_its_process() -> None:
    other = os.getpid() + 1
    request = _Request("t1", other)
    recovery._note_accepted(request)
    assert recovery._accepted_pids("t1") == [other]
    assert recovery._accepted_pids("t2") == []
    del request
    gc.collect()
    assert recovery._accepted_pids("t1") == []  # gone with its request


def test_dead_entries_are_swept_past_the_bound() -> None:
    recovery._accepted_bound[0] = 10
    live = [_Request(f"live{index}", 2) for index in range(3)]
    for request in live:
        recovery._note_accepted(request)
    for index in range(7):
        recovery._note_accepted(_Request(f"dead{index}", 2))  # dead at once
    assert len(recovery._accepted) == 10  # not past the bound: not swept yet
    recovery._note_accepted(_Request("last", 2))  # alive while it is noted
    assert sorted(recovery._accepted) == ["last", "live0", "live1", "live2"]
    assert recovery._accepted_bound[0] == 10_000
