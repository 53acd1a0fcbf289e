"""The lease renewals in the history check: what the workers record of each renewal
(tests/history/app.py, on a real redis-server) and how the checker reads them
(tests/history/checker.py, on made-up histories): a key taken past its slots because a
holder's lease ran out unrenewed is a known cause; one whose holder renewed is a defect."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

import pytest
import redis

from celery_redislock.engine.admission import Lease, SlotLimit, admit

from history import app as history_app
from history.checker import check
from history.events import Recorder
from history.leases import UNRENEWED_CAUSE
from history.table import render
from worker_app import AppUrls

S = 1_000_000  # one second, in µs
LEASE = 3 * S

#: The shape of seed 10 with AOF on ca51fe7: ``short:0`` (one slot, a 3 s lease); a1
#: (worker2) from 148.79 s to 153.60 s, b1 (worker3) from 153.13 s to 155.66 s.
A_START, A_END, B_START, B_END = 148_790_000, 153_600_000, 153_130_000, 155_660_000


def sent(task: str) -> Dict[str, Any]:
    return {"kind": "sent", "t": 0, "task": task, "name": "short", "acks_late": True,
            "limits": [{"key": "short:0", "slots": 1, "cost": 1, "lease_us": LEASE}],
            "rate": None}


def body(task: str, run: str, start: int, end: int, *, token: str, pid: int,
         worker: str) -> List[Dict[str, Any]]:
    return [{"kind": "start", "t": start, "task": task, "run": run, "pid": pid,
             "worker": worker, "token": token, "fence": "7"},
            {"kind": "end", "t": end, "task": task, "run": run}]


def renewal(token: str, sent_at: int, answered: int, outcome: str = "renewed",
            pid: int = 20) -> Dict[str, Any]:
    """A renewal recorded 1 ms after its answer."""
    written = answered + 1000
    return {"kind": "renewal", "t": written, "key": "short:0", "fence": "7", "token": token,
            "lease_s": LEASE / S, "outcome": outcome, "error": "", "pid": pid,
            "sent_ago_us": written - sent_at, "answered_ago_us": written - answered}


def history(renewals: List[Dict[str, Any]], *, recorded: bool = True,
            extra: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Two overlapping bodies of ``short:0`` with ``renewals`` of a1's lease (AOF)."""
    return [{"kind": "run", "t": 0, "persistence": "aof", "renewals": recorded},
            sent("a"), sent("b"),
            *body("a", "a1", A_START, A_END, token="ta", pid=20, worker="worker2"),
            *body("b", "b1", B_START, B_END, token="tb", pid=30, worker="worker3"),
            *renewals, *(extra or []),
            {"kind": "final", "t": 900 * S, "task": "a", "state": "SUCCESS"},
            {"kind": "final", "t": 900 * S, "task": "b", "state": "SUCCESS"},
            {"kind": "settle", "t": 901 * S, "held": {"short:0": 0}, "no_ttl": []}]


def test_an_overlap_after_a_lease_expired_unrenewed_is_known_not_a_defect() -> None:
    # a1 renewed once, answered at 149.80 s, then nothing (stopped, then starved) until
    # b1 started at 153.13 s: 3.33 s without a renewal, longer than the 3 s lease.
    verdict = check(history([renewal("ta", 149_790_000, 149_800_000)]))
    assert verdict.defects() == []
    [overlap] = verdict.overlaps
    assert overlap.known and overlap.runs == ("a1", "b1")
    assert overlap.unrenewed == {"a1": B_START - 149_800_000}
    assert verdict.peaks[0].over and verdict.over_known("short:0")
    table = render("seed 10", verdict, {})
    assert "verdict: PASS" in table and "OVER (known cause)" in table
    assert UNRENEWED_CAUSE in table and "renewed +149.790-149.800 s" in table
    assert re.search(r"renewals: renewed / lost / error +1 / 0 / 0\n", table)
    # a1's longest span without a write: from its renewal's answer to its end.
    assert verdict.longest_unwritten == ((A_END - 149_800_000) / LEASE, A_END - 149_800_000,
                                         LEASE, "a1", "worker2")
    assert re.search(r"longest a lease went unwritten +3.800 s of a 3 s lease \(1.27; a1, "
                     r"worker2\)\n", table)


def test_an_overlap_while_the_holder_renewed_is_a_defect() -> None:
    # a1 renewed every second, the last answered at 152.80 s: its lease lived to 155.8 s.
    fresh = [renewal("ta", at - 10_000, at) for at in
             (149_800_000, 150_800_000, 151_800_000, 152_800_000)]
    verdict = check(history(fresh))
    [overlap] = verdict.overlaps
    assert not overlap.known and overlap.unrenewed == {}
    [defect] = verdict.defects()
    assert defect.startswith("short:0: 2 slots taken at once, of 1 (runs a1, b1); "
                             "first not known at +153.130 s, a1 (worker2, pid 20, ")
    assert "lease written last 0.330 s before" in defect
    assert "renewed +152.790-152.800 s" in defect


def test_without_recorded_renewals_an_overlap_stays_a_defect() -> None:
    # An older history (no renewals recorded): the same overlap cannot be told apart.
    verdict = check(history([], recorded=False))
    assert not verdict.overlaps[0].known and len(verdict.defects()) == 1
    assert "(not recorded)" in render("old", verdict, {})


def test_a_renewal_that_succeeds_after_the_overlap_began_makes_it_a_defect() -> None:
    # No renewal for 3.33 s, then one that found the lease alive: it had not ended.
    late = [renewal("ta", 149_790_000, 149_800_000), renewal("ta", 153_300_000, 153_310_000)]
    assert not check(history(late)).overlaps[0].known


def test_a_store_stop_or_an_unanswered_renewal_may_have_written_the_lease_later() -> None:
    # A renewal that failed with an error at 150.0 s, sent just before the store was
    # stopped for 1 s: the store may have served it at the stop's end, 2.13 s before b1.
    stop = {"kind": "fault", "t": 149_950_000, "fault": "stop_store", "pids": [],
            "worker": "", "duration": 1.0, "data_lost": False}
    renewals = [renewal("ta", 149_790_000, 149_800_000),
                renewal("ta", 149_900_000, 150_000_000, "error")]
    assert not check(history(renewals, extra=[stop])).overlaps[0].known
    # Without the stop the same error leaves the lease written last at its answer.
    assert check(history(renewals)).overlaps[0].known
    # A stop after a1's start delays what a1's start wrote (its adoption) by as long.
    assert check(history([])).overlaps[0].known
    long_stop = {**stop, "t": A_START + 100, "duration": 1.4}
    assert not check(history([], extra=[long_stop])).overlaps[0].known


def test_a_lease_lost_after_a_lease_unrenewed_is_no_defect_with_aof() -> None:
    lost = renewal("ta", 153_200_000, 153_210_000, "lost")
    signal = {"kind": "lease_lost", "t": 153_220_000, "task": "a", "pid": 20, "fence": "7",
              "key": "short:0"}
    verdict = check(history([renewal("ta", 149_790_000, 149_800_000), lost],
                            extra=[signal]))
    assert verdict.lease_lost == 1 and verdict.lease_lost_unrenewed == 1
    assert verdict.defects() == []
    # Renewed 0.4 s before the renewal that found it gone: lost with its data kept.
    recent = check(history([renewal("ta", 152_800_000, 152_810_000), lost], extra=[signal]))
    assert recent.lease_lost_unrenewed == 0
    assert "1 lease(s) lost though the lock store kept its data" in recent.defects()


@pytest.fixture
def recorded_renewals(history_urls: AppUrls, monkeypatch: pytest.MonkeyPatch) -> AppUrls:
    """The history app's renewal records installed on ``Lease`` for this test only,
    recording into database 3 of the session's redis-server; its URLs."""
    monkeypatch.setattr(Lease, "renew", Lease.renew)
    monkeypatch.setattr(Lease, "_history_recorded", False, raising=False)
    history_app._record_renewals(history_urls)
    return history_urls


def test_each_renewal_is_recorded_with_its_outcome_and_passed_on(
        recorded_renewals: AppUrls, closed_port: int) -> None:
    lock = redis.Redis.from_url(recorded_renewals.lock)
    lease = admit(lock, [SlotLimit("history-renewal", 1, "hist:")], lease=3)
    assert lease.renew() is True
    assert lease.release() is True
    assert lease.renew() is False  # released: the lease had ended
    lease._client = redis.Redis(port=closed_port, socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        lease.renew()
    events = [e for e in Recorder(recorded_renewals.record).history()
              if e["kind"] == "renewal"]
    assert [e["outcome"] for e in events] == ["renewed", "lost", "error"]
    assert events[2]["error"] == "ConnectionError"
    first = events[0]
    assert (first["key"], first["fence"], first["token"], first["lease_s"]) == (
        lease.name, str(lease.fence), lease.token, 3.0)
    assert 0 <= first["answered_ago_us"] <= first["sent_ago_us"]
