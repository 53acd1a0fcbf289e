"""The lease of a run that ended with no run waiting in its worker, kept for the next run
of its limits for at most ``SPARE_FOR`` (``gate/kept_leases.py``: ``keep``, ``take``): taken,
that run goes to the pool under it as a run handed a slot does; not taken, it is given
back once; never a copy's, an old lease's, or another limits' run's. The real-worker
checks (the limit holds, each run runs once, every slot comes back) are
``test_hand_on.py``'s, where these leases are handed on too."""

from __future__ import annotations

import functools
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

from celery_redislock.gate import gate, hand_on, kept_leases, room
from celery_redislock.pool.attempt import ADMITTED, MAIN_RELEASES


def _limits() -> Any:
    """Slots only, under a constant key: runs that may be handed a slot."""
    rule = SimpleNamespace(rate=None, slots=2, is_constant=True)
    return SimpleNamespace(rules=[rule], unique=None, period=None)


class _Timer:
    def __init__(self) -> None:
        self.calls: List[Tuple[float, Callable[..., Any], Tuple[Any, ...]]] = []

    def call_after(self, seconds: float, fun: Callable[..., Any], args: Tuple[Any, ...],
                   priority: int = 0) -> None:
        self.calls.append((seconds, fun, args))


class _Consumer:
    def __init__(self) -> None:
        self.hub = object()
        self.timer = _Timer()


class _Request:
    def __init__(self, task_id: str) -> None:
        self.id = task_id
        self.request_dict: Dict[str, Any] = {}
        self.on_success = self.on_failure = lambda *args, **kwargs: None


@pytest.fixture
def consumer() -> Iterator[_Consumer]:
    consumer = _Consumer()
    room.rooms[consumer] = room.Room()
    yield consumer
    room.rooms.pop(consumer, None)


def _release(limits: Any, given_back: List[str], taken: float = 0.0) -> hand_on.MainRelease:
    handed = {"member": "w1|t1|s:ab 1 2 {}", "lease": 60.0, "parts": [],
              "taken": taken or time.monotonic()}
    return hand_on.MainRelease(handed, limits, functools.partial(
        lambda record: given_back.append(record["member"]), handed))


def _time_up(consumer: _Consumer) -> None:
    """The kept leases' time is up (as the timer finds them :data:`kept_leases.SPARE_FOR` on)."""
    leases = _spares(consumer).leases
    for index, (release, _) in enumerate(leases):
        leases[index] = (release, 0.0)


def _spares(consumer: _Consumer) -> kept_leases.Spares:
    spares = room.rooms[consumer].spares
    assert spares is not None
    return spares  # type: ignore[no-any-return]


def _kept(consumer: _Consumer) -> List[hand_on.MainRelease]:
    spares = room.rooms[consumer].spares
    return [] if spares is None else [release for release, _ in spares.leases]


def test_a_kept_lease_goes_to_the_next_run_of_its_limits(consumer: _Consumer) -> None:
    limits, handled = _limits(), []  # type: Any, List[Any]
    given_back: List[str] = []
    release = _release(limits, given_back)
    assert kept_leases.keep(consumer, release)
    assert [(seconds, fun) for seconds, fun, _ in consumer.timer.calls] == [
        (kept_leases.SPARE_FOR, kept_leases._unused)]
    request = _Request("t2")
    hold = room.Hold(limits=limits)
    kept = kept_leases.take(consumer, hold)
    assert kept is release and _kept(consumer) == []
    gate._hand_to(consumer, request, handled.append, hold, kept)
    assert handled == [request] and given_back == []
    admitted = request.request_dict[ADMITTED]
    assert admitted[hand_on.HANDED_ON] == 1 and admitted[MAIN_RELEASES]
    assert hand_on.token_of("t2") == "w1|t1|s:ab"
    kept_leases._unused(*consumer.timer.calls[0][2])  # the timer finds it taken
    assert given_back == []
    request.on_success()  # its end gives the lease back (no run waits)...
    assert len(_kept(consumer)) == 1  # ...or keeps it again
    _time_up(consumer)
    kept_leases._unused(*consumer.timer.calls[-1][2])
    assert given_back == ["w1|t1|s:ab 1 2 {}"]
    hand_on.forget("t2")


def test_a_kept_lease_no_run_takes_is_given_back_once(consumer: _Consumer) -> None:
    limits, given_back = _limits(), []  # type: Any, List[str]
    release = _release(limits, given_back)
    assert kept_leases.keep(consumer, release)
    # one at a time (a pool of one)
    assert not kept_leases.keep(consumer, _release(limits, given_back))
    _time_up(consumer)
    kept_leases._unused(*consumer.timer.calls[0][2])
    kept_leases._unused(*consumer.timer.calls[0][2])
    assert given_back == ["w1|t1|s:ab 1 2 {}"]
    assert kept_leases.take(consumer, room.Hold(limits=limits)) is None


def test_one_timer_gives_the_kept_leases_back(consumer: _Consumer) -> None:
    """A lease kept while the timer of an earlier one is set sets none: the timer comes
    back for it when its time is up, and gives it back then, once."""
    limits, given_back = _limits(), []  # type: Any, List[str]
    first = _release(limits, given_back)
    assert kept_leases.keep(consumer, first)
    assert kept_leases.take(consumer, room.Hold(limits=limits)) is first  # taken
    second = _release(limits, given_back)
    assert kept_leases.keep(consumer, second)
    assert len(consumer.timer.calls) == 1  # the first one's timer is still set
    kept_leases._unused(*consumer.timer.calls[0][2])  # the second one's time is not up
    assert given_back == [] and _kept(consumer) == [second]
    seconds, fun, args = consumer.timer.calls[-1]
    assert len(consumer.timer.calls) == 2 and 0 < seconds <= kept_leases.SPARE_FOR
    _time_up(consumer)
    fun(*args)
    fun(*args)
    assert given_back == ["w1|t1|s:ab 1 2 {}"] and _kept(consumer) == []
    assert kept_leases.keep(consumer, _release(limits, given_back))  # a timer anew
    assert len(consumer.timer.calls) == 3


def test_as_many_leases_as_pool_processes_are_kept(consumer: _Consumer) -> None:
    """Two runs that end together each keep their lease (a pool of two), taken by the
    next two runs in the order kept; a third is given back at once."""
    limits, given_back = _limits(), []  # type: Any, List[str]
    first, second = _release(limits, given_back), _release(limits, given_back)
    assert kept_leases.keep(consumer, first)
    _spares(consumer).most = 2
    assert kept_leases.keep(consumer, second)
    assert not kept_leases.keep(consumer, _release(limits, given_back))
    assert len(consumer.timer.calls) == 1 and _kept(consumer) == [first, second]
    assert kept_leases.take(consumer, room.Hold(limits=limits)) is first
    _time_up(consumer)
    kept_leases._unused(*consumer.timer.calls[0][2])
    assert given_back == ["w1|t1|s:ab 1 2 {}"] and _kept(consumer) == []
    assert kept_leases.take(consumer, room.Hold(limits=limits)) is None


@pytest.mark.parametrize("hold", [
    dict(copy=True),  # a copy of a waiting run's message
    dict(promises={"k": 1}),  # holds a rate limit's promise
    dict(limits=None),  # another task's limits
])
def test_a_kept_lease_goes_only_to_a_newcomer_of_the_same_limits(
        consumer: _Consumer, hold: Dict[str, Any]) -> None:
    limits, given_back = _limits(), []  # type: Any, List[str]
    assert kept_leases.keep(consumer, _release(limits, given_back))
    held = room.Hold(copy=hold.get("copy", False),
                     limits=limits if "limits" not in hold else _limits())
    held.promises = hold.get("promises", {})
    assert kept_leases.take(consumer, held) is None
    assert len(_kept(consumer)) == 1 and given_back == []


def test_an_old_lease_is_not_kept(consumer: _Consumer) -> None:
    limits, given_back = _limits(), []  # type: Any, List[str]
    old = _release(limits, given_back, taken=time.monotonic() - hand_on.HAND_ON_AGE - 0.1)
    assert not kept_leases.keep(consumer, old)
    assert consumer.timer.calls == [] and _kept(consumer) == []


def test_a_lease_handed_on_carries_its_holder_token() -> None:
    """Each run a lease is handed on to is noted under the token of the run it was first
    taken for, worked out once for the chain."""
    given_back: List[str] = []
    handed, second = _release(_limits(), given_back).pass_on("t3")
    assert second is not None and second.token == "w1|t1|s:ab" == hand_on.token_of("t3")
    _, third = second.pass_on("t4")
    assert third is not None and third.token == second.token == hand_on.token_of("t4")
    assert third.handed[hand_on.HANDED_ON] == 2 and handed[hand_on.HANDED_ON] == 1
    hand_on.forget("t3")
    hand_on.forget("t4")
