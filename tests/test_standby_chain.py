"""A chain of standbys in one worker (``gate/standby.py``) with fakes for the worker, the
lock store and the gate: a run that ends hands its slot to the standby held for its key,
unless its lease was handed on ``CHAIN_RUNS`` times in a row: then the slot goes back to
the store (its release hands it to the line) and the standby stays held."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import pytest

from celery_redislock.gate import hand_on, standby

KEY = "redislock:{ab}:s:fair"


class _Store:
    """The hub store: what was given back, the scripts sent."""

    def __init__(self) -> None:
        self.given_back: List[Dict[str, Any]] = []
        self.scripts: List[Any] = []

    def give_back(self, handed: Dict[str, Any], publish: Any) -> bool:
        self.given_back.append(handed)
        return True

    def run_script(self, script: Any, keys: List[str], args: List[Any], reply: Any) -> None:
        self.scripts.append((script, keys, args))


class _Consumer:
    """A worker's consumer (no timer, no prefetch window)."""


class _Request:
    def __init__(self, task_id: str) -> None:
        self.id = task_id
        self.task = SimpleNamespace(app=None)

    def revoked(self) -> bool:
        return False


def _gate(sent: List[Tuple[str, Dict[str, Any]]]) -> standby.Gate:
    def to_pool(consumer: Any, request: Any, handle: Any, record: Dict[str, Any]) -> None:
        sent.append((request.id, record))

    def never(*args: Any) -> None:
        raise AssertionError("not expected")

    return standby.Gate(again=never, to_pool=to_pool, ask_now=never)


def _held_here(consumer: Any, task_id: str) -> standby.Standby:
    """A standby of ``KEY`` held in ``consumer``'s worker, behind one run of ``KEY``."""
    mine = standby.standbys_of(consumer)
    assert mine is not None
    held = standby.Standby(KEY, _Request(task_id), handle=lambda request: None,
                           state=standby.State.HELD, holds=1, run=f"{task_id}:0",
                           park_id="=1:2")
    mine.follow(held)
    mine.line(KEY).held.append(held)
    mine.line(KEY).running["ending"] = None
    return held


def _record(handed_on: int) -> Dict[str, Any]:
    return {"member": "w1|t1|s:ab 1 2 {}", "lease": 60.0, "taken": time.monotonic(),
            "keys": [KEY], hand_on.HANDED_ON: handed_on}


@pytest.mark.parametrize("handed_on", [0, standby.CHAIN_RUNS - 1])
def test_a_run_that_ends_hands_its_slot_to_the_standby(handed_on: int) -> None:
    consumer, store = _Consumer(), _Store()
    sent: List[Tuple[str, Dict[str, Any]]] = []
    _held_here(consumer, "next")
    standby._ended(consumer, _Request("ending"), store, KEY, _record(handed_on), _gate(sent))
    assert [task_id for task_id, _ in sent] == ["next"] and not store.given_back
    assert sent[0][1][hand_on.HANDED_ON] == handed_on + 1
    assert [script for script, _, _ in store.scripts] == [standby.STANDBY_CLAIM]


def test_a_lease_handed_on_chain_runs_times_goes_back_to_the_store() -> None:
    """The chain yields: the slot is given back (to the line), the standby stays held for
    the next run of its key that ends here, and no other standby is asked for."""
    consumer, store = _Consumer(), _Store()
    sent: List[Tuple[str, Dict[str, Any]]] = []
    held = _held_here(consumer, "next")
    record = _record(standby.CHAIN_RUNS)
    standby._ended(consumer, _Request("ending"), store, KEY, record, _gate(sent))
    assert not sent and store.given_back == [record] and not store.scripts
    mine = standby.standbys_of(consumer)
    assert mine is not None and list(mine.line(KEY).held) == [held]
    assert held.state is standby.State.HELD and not mine.line(KEY).running
