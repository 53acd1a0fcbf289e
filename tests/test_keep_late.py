"""A moved copy still queued when its backup is due keeps the slot reserved for it
(``engine/late.py``, ``engine/lua/keep_late.lua``) as long as it is seen there (only
presumed there: within a bound), one reservation a copy. On a private redis-server.
The poll's side (the broker's late copies passed here, a lost one still put back):
test_parking_backup.py."""

from __future__ import annotations

from typing import Any, List, Tuple

import pytest
import redis

from celery_redislock.engine import late
from celery_redislock.engine import parking as store
from celery_redislock.engine.admission import Busy, Lease, SlotLimit
from celery_redislock.engine.late import keep_late
from celery_redislock.engine.parking import park_admit, run_id

from support import wait_until

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


def test_a_copy_seen_is_kept_past_any_fixed_bound(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """No bound while the copy is seen: each look keeps it KEEP_MS from then (before,
    never more than 60 s past the reservation's first end)."""
    monkeypatch.setattr(late, "KEEP_MS", 600_000)
    key, _ = hand_over(redis_client, 1)
    [(member, first_end)] = reservations(redis_client, key)
    before = server_ms(redis_client)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    [(same, end)] = reservations(redis_client, key)
    assert same == member and end >= before + 600_000 > first_end + 60_000


def test_a_copy_only_presumed_is_kept_no_longer_than_the_bound(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy in a queue too long to look in: kept PRESUMED_MS past its first naming
    at most; once seen, from its last sighting."""
    monkeypatch.setattr(late, "KEEP_MS", 600_000)
    monkeypatch.setattr(late, "PRESUMED_MS", 20_000)
    key, _ = hand_over(redis_client, 1)
    [(member, _)] = reservations(redis_client, key)
    before = server_ms(redis_client)
    assert keep_late(redis_client, [], [(key, "m1")]) == 1
    [(_, end)] = reservations(redis_client, key)
    assert before + 20_000 <= end <= server_ms(redis_client) + 20_000
    assert keep_late(redis_client, [], [(key, "m1")]) == 0  # at its bound: no further
    assert reservations(redis_client, key) == [(member, end)]
    assert keep_late(redis_client, [(key, "m1")]) == 1  # seen: KEEP_MS from now
    [(_, seen_end)] = reservations(redis_client, key)
    assert seen_end >= before + 600_000


def test_a_copy_presumed_past_its_bound_holds_nothing(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its bound a presumed copy is untied: another copy may be kept there."""
    monkeypatch.setattr(late, "KEEP_MS", 600_000)
    monkeypatch.setattr(late, "PRESUMED_MS", 300)
    key, _ = hand_over(redis_client, 1)
    start = server_ms(redis_client)
    assert keep_late(redis_client, [], [(key, "m1")]) == 0  # ends later than its bound
    wait_until(lambda: server_ms(redis_client) > start + 400, 5.0, what="m1's bound to pass")
    assert keep_late(redis_client, [], [(key, "m1")]) == 0
    assert keep_late(redis_client, [(key, "m2")]) == 1  # the reservation was free for m2


def test_each_late_copy_keeps_a_reservation_of_its_own(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, _ = hand_over(redis_client, 3, slots=2)
    assert keep_late(redis_client, [(key, "m1"), (key, "m2"), (key, "m3")]) == 2
    monkeypatch.setattr(late, "KEEP_MS", 40_000)
    assert keep_late(redis_client, [(key, "m1"), (key, "m1")]) == 1  # the same one again
    assert keep_late(redis_client, [(key, "m3")]) == 0  # none was left for m3


def test_a_copy_whose_reservation_changed_hands_is_tied_to_another(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy of move m1 was given reservation 1; another moved copy took it, and the
    slot was handed over again (reservation 2): m1, still seen in its queue, still has
    its key's turn, and keeps reservation 2."""
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, parked = hand_over(redis_client, 2)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    taken = ask(redis_client, "run-0", parked=parked[0].park)  # another copy takes it
    assert isinstance(taken, Lease) and reservations(redis_client, key) == []
    assert taken.release()
    [(member, end)] = reservations(redis_client, key)
    assert member == "2"
    assert keep_late(redis_client, [(key, "m1")]) == 1
    [(same, kept)] = reservations(redis_client, key)
    assert same == member and kept > end


def test_a_copy_no_longer_looked_at_leaves_its_reservation_to_others(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """m1 was tied to the only reservation and is no longer named (a worker took it, or
    it is lost): KEEP_MS after its last look, m2 may be kept there."""
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, _ = hand_over(redis_client, 1)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    assert keep_late(redis_client, [(key, "m2")]) == 0  # m1 holds it
    monkeypatch.setattr(late, "KEEP_MS", 300)
    start = server_ms(redis_client)
    assert keep_late(redis_client, [(key, "m1")]) == 0  # looked at: forgotten 0.3 s on
    wait_until(lambda: server_ms(redis_client) > start + 400, 5.0, what="m1's last look to age")
    assert keep_late(redis_client, [(key, "m2")]) == 0  # tied to m2 (not kept: ends later)
    monkeypatch.setattr(late, "KEEP_MS", 60_000)
    assert keep_late(redis_client, [(key, "m2")]) == 1
    assert keep_late(redis_client, [(key, "m1")]) == 0  # m1, seen again, finds it taken


def test_a_lapsed_reservation_is_not_kept(redis_client: redis.Redis,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, _ = hand_over(redis_client, 1)
    [(member, _)] = reservations(redis_client, key)
    lapsed = server_ms(redis_client) - 1
    redis_client.zadd(key.replace("}:s:", "}:pv:", 1), {member: lapsed})
    assert keep_late(redis_client, [(key, "m1")]) == 0
    assert reservations(redis_client, key) == [(member, lapsed)]


def lapsed_hand_over(client: redis.Redis) -> Tuple[str, str, int]:
    """Two runs parked behind one slot, released: its reservation, lapsed (its slot
    free). The key, the reservation and when it lapsed."""
    key, _ = hand_over(client, 2)
    [(member, _)] = reservations(client, key)
    lapsed = server_ms(client) - 1
    client.zadd(key.replace("}:s:", "}:pv:", 1), {member: lapsed})
    client.zadd(key, {"~~" + member: lapsed})
    return key, member, lapsed


def test_a_slot_freed_while_a_late_copy_holds_none_is_reserved_for_it(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A move made long after its hand-over: its reservation lapsed before the copy's
    first look (nothing to keep). The poll that finds the slot free reserves it for the
    late copy, tied to it, instead of moving the next run; the next look keeps it."""
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, member, lapsed = lapsed_hand_over(redis_client)
    assert keep_late(redis_client, [(key, "m1")]) == 0  # none live to keep
    assert store.due(redis_client, {key: 1}, prefix=PREFIX) == []  # run-1 not moved
    [(again, end)] = [(m, e) for m, e in reservations(redis_client, key) if e > lapsed]
    assert again != member and end > server_ms(redis_client)
    assert keep_late(redis_client, [(key, "m1")]) == 1  # tied to it: kept
    monkeypatch.setattr(late, "KEEP_MS", 60_000)
    assert keep_late(redis_client, [(key, "m2")]) == 0  # m1's, not another copy's


def test_a_late_copy_not_seen_lately_gets_no_new_reservation(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy presumed past its bound holds no turn: the slot freed goes to the next run
    (a move owed), as without a late copy."""
    monkeypatch.setattr(late, "PRESUMED_MS", 0)
    key, _, _ = lapsed_hand_over(redis_client)
    assert keep_late(redis_client, [], [(key, "m1")]) == 0
    assert [move.key for move in store.due(redis_client, {key: 1}, prefix=PREFIX)] == [key]


def test_a_late_copy_received_is_forgotten_and_its_end_hands_the_slot_on(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Late copy m1 (run-0) is received and takes its reservation: it is no longer a
    late copy, so its run's end moves the next run (before, a slot freed within 4 s of
    m1's last look was reserved again for m1, which had already run: the slot stayed
    idle until that reservation lapsed and a poll moved run-1, 1.55 slots handed per run
    and a hand-off p50 of 12 s in bench_line's 4,000 runs over 2,000 keys under load)."""
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, parked = hand_over(redis_client, 2)
    assert keep_late(redis_client, [(key, "m1")]) == 1
    taken = park_admit(redis_client, [SlotLimit("late", 1, PREFIX)], lease=30,
                       run=run_id("run-0", 0), parked=parked[0].park, copy="m1")
    assert isinstance(taken, Lease) and reservations(redis_client, key) == []
    looks, given = (key.replace("}:s:", mark, 1) for mark in ("}:py:", "}:pl:"))
    assert redis_client.zscore(looks, "m1") is None
    assert not any(b"m1" in field for field in redis_client.hkeys(given))
    assert taken.release()
    assert [move.key for move in taken.handoffs] == [key]  # run-1 moved at once
    assert len(reservations(redis_client, key)) == 1


def test_a_late_copy_takes_the_reservation_tied_to_it(
        redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two late copies tied to a reservation each: the one received takes its own, and
    the other keeps the one it is tied to."""
    monkeypatch.setattr(late, "KEEP_MS", 30_000)
    key, parked = hand_over(redis_client, 3, slots=2)
    assert keep_late(redis_client, [(key, "m1"), (key, "m2")]) == 2
    given = key.replace("}:s:", "}:pl:", 1)
    tied = {move: redis_client.hget(given, move).decode() for move in ("m1", "m2")}
    taken = park_admit(redis_client, [SlotLimit("late", 2, PREFIX)], lease=30,
                       run=run_id("run-1", 0), parked=parked[1].park, copy="m2")
    assert isinstance(taken, Lease)
    assert [member for member, _ in reservations(redis_client, key)] == [tied["m1"]]
    monkeypatch.setattr(late, "KEEP_MS", 60_000)
    assert keep_late(redis_client, [(key, "m1")]) == 1  # still its own
