"""A moved copy still queued when its backup is due keeps the slot reserved for it
(``engine/late.py``, ``engine/lua/keep_late.lua``), within a bound, and only the
reservation it was first given. On a private redis-server. The poll's side (the
broker's late copies passed here, a lost one still put back): test_parking_backup.py."""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest
import redis

from celery_redislock.engine import late
from celery_redislock.engine.admission import Busy, Lease, SlotLimit
from celery_redislock.engine.late import keep_late
from celery_redislock.engine.parking import park_admit, run_id

PREFIX = "redislock:"


def ask(client: Any, task: str, slots: int = 1, parked: Any = None) -> Any:
    return park_admit(client, [SlotLimit("late", slots, PREFIX)], lease=30,
                      run=run_id(task, 0), parked=parked)


def reservations(client: redis.Redis, key: str) -> List[Tuple[str, int]]:
    """The live reservations of ``key``'s line: (member, end ms), in the order they end."""
    found = client.zrange(key.replace("}:s:", "}:pv:", 1), 0, -1, withscores=True)
    return [(member.decode(), int(end)) for member, end in found]


def hand_over(client: redis.Redis, runs: int, slots: int = 1) -> Tuple[str, List[Busy]]:
    """``slots`` holders, ``runs`` runs parked behind them, the holders released: a
    reservation per slot. The key and the parked runs' refusals."""
    held = [ask(client, f"holder-{i}", slots) for i in range(slots)]
    assert all(isinstance(lease, Lease) for lease in held)
    parked = [ask(client, f"run-{i}", slots) for i in range(runs)]
    assert all(isinstance(busy, Busy) and busy.park for busy in parked)
    for lease in held:
        assert lease.release()
    key = parked[0].key
    assert len(reservations(client, key)) == slots
    return key, parked


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_late_copy_keeps_its_reservation(redis_client: redis.Redis,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 30_000)  # past the reservation's 10 s
    key, _ = hand_over(redis_client, 1)
    [(member, first_end)] = reservations(redis_client, key)
    before = server_ms(redis_client)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    [(same, end)] = reservations(redis_client, key)
    assert same == member and before + 30_000 <= end <= server_ms(redis_client) + 30_000
    assert int(redis_client.zscore(key, "~~" + member)) == end  # the slot, held as long
    assert redis_client.pttl(key) > end - server_ms(redis_client)
    assert end > first_end


def test_a_reservation_still_far_from_its_end_is_left_as_it_is(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 5_000)
    key, _ = hand_over(redis_client, 1)
    ends = reservations(redis_client, key)
    assert keep_late(redis_client, [(key, "m1")]) == 0  # 5 s from now: it ends later
    assert reservations(redis_client, key) == ends


def test_a_reservation_is_kept_no_longer_than_the_bound(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 600_000)
    monkeypatch.setattr(late, "MOST_MS", 2_000)
    key, _ = hand_over(redis_client, 1)
    [(member, first_end)] = reservations(redis_client, key)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    assert reservations(redis_client, key) == [(member, first_end + 2_000)]
    assert keep_late(redis_client, [(key, "m1")]) == 0  # at its bound: no further
    assert reservations(redis_client, key) == [(member, first_end + 2_000)]


def test_each_late_copy_keeps_a_reservation_of_its_own(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, _ = hand_over(redis_client, 3, slots=2)
    assert keep_late(redis_client, [(key, "m1"), (key, "m2"), (key, "m3")]) == 2
    monkeypatch.setattr(late, "KEEP_MS", 40_000)
    assert keep_late(redis_client, [(key, "m1"), (key, "m1")]) == 1  # the same one again
    assert keep_late(redis_client, [(key, "m3")]) == 0  # none was left for m3


def test_no_other_reservation_once_the_copys_changed_hands(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy of move m1 was given reservation 1; another moved copy took it, and the
    slot was handed over again (reservation 2): m1 still late keeps nothing."""
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, parked = hand_over(redis_client, 2)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    taken = ask(redis_client, "run-0", parked=parked[0].park)  # another copy takes it
    assert isinstance(taken, Lease) and reservations(redis_client, key) == []
    assert taken.release()
    [(member, end)] = reservations(redis_client, key)
    assert member == "2"
    assert keep_late(redis_client, [(key, "m1")]) == 0
    assert reservations(redis_client, key) == [(member, end)]


def test_a_lapsed_reservation_is_not_kept(redis_client: redis.Redis,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, _ = hand_over(redis_client, 1)
    [(member, _)] = reservations(redis_client, key)
    lapsed = server_ms(redis_client) - 1
    redis_client.zadd(key.replace("}:s:", "}:pv:", 1), {member: lapsed})
    assert keep_late(redis_client, [(key, "m1")]) == 0
    assert reservations(redis_client, key) == [(member, lapsed)]
