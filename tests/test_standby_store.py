"""Standbys, the lock store's side (``engine/standby.py``, ``lua/standby.lua``): a moved
copy held with no slot, a holder's slot handed to it in one call, the next standby
owed; on a real redis-server."""

from __future__ import annotations

from typing import Any, List, Tuple

from celery_redislock.engine.admission import Busy, Lease, ParkedMove, ParkRef, SlotLimit
from celery_redislock.engine.parking import (
    ParkAsk,
    moved_nothing,
    park_admit,
    prepare_park_admit,
    run_id,
)
from celery_redislock.engine.standby import ask_standby, is_standby, standby_call

PREFIX = "redislock:"


def limiters(sub: str, slots: int = 1) -> List[SlotLimit]:
    return [SlotLimit("standby", slots, PREFIX, 1, sub)]


def holders(client: Any, key: str) -> int:
    return int(client.zcount(key, "(0", "+inf"))


def parked(client: Any, task: str, sub: str, slots: int = 1) -> ParkRef:
    outcome = park_admit(client, limiters(sub, slots), lease=30, run=run_id(task, 0))
    assert isinstance(outcome, Busy) and outcome.park is not None
    return outcome.park


def ask(client: Any, task: str, ref: ParkRef, sub: str, swap: Any = None,
        slots: int = 1) -> Any:
    call = prepare_park_admit(client, limiters(sub, slots),
                              ParkAsk(lease=30, run=run_id(task, 0), parked=ref))
    assert call is not None
    return standby_call(call, swap).run()


def line(client: Any) -> Tuple[Lease, ParkRef, ParkRef, ParkRef]:
    holder = park_admit(client, limiters("tenant:h"), lease=30, run=run_id("h", 0))
    assert isinstance(holder, Lease)
    return (holder, parked(client, "a1", "tenant:a"), parked(client, "a2", "tenant:a"),
            parked(client, "b1", "tenant:b"))


def test_a_standby_is_owed_in_turn_and_held_without_a_slot(redis_client):
    holder, a1, _, _ = line(redis_client)
    moves = ask_standby(redis_client, holder.handover()["keys"][0])
    assert next(m.sub for m in moves if isinstance(m, ParkedMove)).startswith("tenant:a")
    held = ask(redis_client, "a1", a1, "tenant:a")
    assert isinstance(held, Busy) and held.park is not None and is_standby(held.park.park_id)
    assert holders(redis_client, holder.handover()["keys"][0]) == 1  # the holder: no slot taken


def test_a_holders_slot_goes_to_the_standby_and_the_next_is_owed(redis_client):
    holder, a1, _, _ = line(redis_client)
    ask_standby(redis_client, holder.handover()["keys"][0])
    ask(redis_client, "a1", a1, "tenant:a")
    member = holder.handover()["member"]
    got = ask(redis_client, "a1", a1, "tenant:a", swap=member)
    assert isinstance(got, Lease)
    key = holder.handover()["keys"][0]
    assert holders(redis_client, key) == 1 and redis_client.zscore(key, member) is None
    owed = [m.sub for m in got.handoffs if isinstance(m, ParkedMove)]
    assert len(owed) == 1 and owed[0].startswith("tenant:b")  # b's turn next
    assert not holder.release()  # already handed on: releasing frees nothing


def test_a_swap_from_a_holder_gone_takes_nothing(redis_client):
    holder, a1, _, _ = line(redis_client)
    ask_standby(redis_client, holder.handover()["keys"][0])
    ask(redis_client, "a1", a1, "tenant:a")
    member = holder.handover()["member"]
    assert holder.release()  # its slot went to the line (reserved, a move owed)
    got = ask(redis_client, "a1", a1, "tenant:a", swap=member)
    assert isinstance(got, Lease)  # the reservation the release made: one holder
    assert holders(redis_client, holder.handover()["keys"][0]) == 1


def test_a_standby_copy_asking_plainly_parks_again_once(redis_client):
    """A worker killed with a standby: the broker gives the copy back, and it asks as
    any moved copy: no slot for it, it parks again (one reference, counted once)."""
    holder, a1, _, _ = line(redis_client)
    ask_standby(redis_client, holder.handover()["keys"][0])
    ask(redis_client, "a1", a1, "tenant:a")
    again = park_admit(redis_client, limiters("tenant:a"), lease=30, run=run_id("a1", 0),
                       parked=a1)
    assert isinstance(again, Busy) and again.park is not None
    assert not is_standby(again.park.park_id)
    assert holders(redis_client, holder.handover()["keys"][0]) == 1
    assert holder.release()
    moved = [m for m in holder.handoffs if isinstance(m, ParkedMove)]
    assert len(moved) == 1
    got = park_admit(redis_client, limiters("tenant:a"), lease=30, run=run_id("a1", 0),
                     parked=again.park)
    assert isinstance(got, Lease)


def test_a_standby_handed_a_slot_without_waiting_is_claimed_by_its_holder(redis_client):
    from celery_redislock.engine.standby import claim_standby

    holder, a1, _, _ = line(redis_client)
    key = holder.handover()["keys"][0]
    ask_standby(redis_client, key)
    held = ask(redis_client, "a1", a1, "tenant:a")
    member = holder.handover()["member"]
    claimed, owed = claim_standby(redis_client, key, member, run_id("a1", 0), held.park.park_id)
    assert claimed and [m.sub[:8] for m in owed if isinstance(m, ParkedMove)] == ["tenant:b"]
    ref = redis_client.hget(key.replace("}:s:", "}:pr:"), run_id("a1", 0)).decode()
    assert ref.startswith("c ") and ref.split()[3] == holder.token
    assert holders(redis_client, key) == 1
    from celery_redislock.engine.scripts import RELEASE

    assert RELEASE.run(redis_client, [key], [member, 0, 0])[0] == 1  # as a worker releases
    assert redis_client.hget(key.replace("}:s:", "}:pr:"), run_id("a1", 0)).startswith(b"s")


def test_a_claim_renews_the_lease_a_chain_of_standbys_passes_on(redis_client):
    """A chain of standbys runs under one lease, handed on from run to run: the claim
    sent at each hand-off renews it from the server's now, so it never grows old."""
    from celery_redislock.engine.standby import claim_standby

    holder, a1, _, _ = line(redis_client)  # lease 30 s
    key, member = holder.handover()["keys"][0], holder.handover()["member"]
    ask_standby(redis_client, key)
    held = ask(redis_client, "a1", a1, "tenant:a")
    seconds, micros = redis_client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    claimed, _ = claim_standby(redis_client, key, member, run_id("a1", 0), held.park.park_id,
                               lease=60)
    assert claimed
    assert float(redis_client.zscore(key, member)) >= now_ms + 60_000  # renewed: 30 s before
    assert redis_client.pttl(key) >= 59_000  # the key lives as long
    claim_end = redis_client.zscore(key.replace("}:s:", "}:pe:"), holder.token)
    assert float(claim_end) >= now_ms + 60_000  # the standby's reference: claimed as long


def test_a_claim_for_a_holder_gone_renews_nothing(redis_client):
    from celery_redislock.engine.standby import claim_standby

    holder, a1, _, _ = line(redis_client)
    key, member = holder.handover()["keys"][0], holder.handover()["member"]
    ask_standby(redis_client, key)
    held = ask(redis_client, "a1", a1, "tenant:a")
    assert holder.release()
    claimed, _ = claim_standby(redis_client, key, member, run_id("a1", 0), held.park.park_id,
                               lease=60)
    assert not claimed and redis_client.zscore(key, member) is None


def test_a_fair_line_whose_parked_runs_are_all_owed_a_move_owes_no_standby(redis_client):
    """Every run parked in a fair line is owed a move: a standby asked for then owes none
    (a move from the line's own queue would take one of those runs a second time, and
    its sub-line's move, finding nothing, would leave it counted as waiting for ever)."""
    holder, _, _, _ = line(redis_client)  # tenant a: 2 runs parked, tenant b: 1
    key = holder.handover()["keys"][0]
    owed = [move for _ in range(5) for move in ask_standby(redis_client, key)
            if isinstance(move, ParkedMove)]
    assert sorted(move.sub.split("\x1e")[0] for move in owed) == [
        "tenant:a", "tenant:a", "tenant:b"]


def test_a_standby_move_that_finds_nothing_takes_no_other_moves_reservation(redis_client):
    """A standby's move has no slot reserved for it: one that finds its parking queue
    empty gives back its sub-line's count only. It used to give back the first live
    reservation of the key, another move's, whose copy then found no slot kept for it."""
    holder, _, _, _ = line(redis_client)
    key = holder.handover()["keys"][0]
    standby = ask_standby(redis_client, key)
    assert [type(move).__name__ for move in standby] == ["StandbyMove"]
    assert holder.release()  # its slot is reserved for the line, a move owed
    assert redis_client.zcard(key.replace("}:s:", "}:pv:")) == 1
    assert not moved_nothing(redis_client, key, standby[0].sub, reserved=False)
    assert redis_client.zcard(key.replace("}:s:", "}:pv:")) == 1  # still reserved
    assert moved_nothing(redis_client, key, standby[0].sub)  # a reserved move's gives it
