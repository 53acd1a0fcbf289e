"""The thin release of the worker's main process (``HubStore.release_record``): the lease
of an admission's handover record given back from the record itself, with the same
commands, and the same wake of a line formed meanwhile, as the release of the
:class:`~celery_redislock.engine.admission.Lease` made from it; anything it cannot
release so is left to that release. Real kombu ``Hub``, real redis-server."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import pytest
from kombu.asynchronous import Hub
from test_hub_store import run_until

from celery_redislock.engine.admission import CONTENDED, Lease, SlotLimit, admit
from celery_redislock.engine.hub_store import HubStore


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


def _handed(client: Any, name: str, slots: int = 3) -> Dict[str, Any]:
    lease = admit(client, [SlotLimit(name, slots, "redislock:")], lease=30, reserve_ms=5000)
    assert isinstance(lease, Lease)
    return lease.handover()


def _sent(store: HubStore) -> List[Tuple[bytes, Any]]:
    """Capture what ``store`` sends instead of sending it."""
    sent: List[Tuple[bytes, Any]] = []
    store.send = lambda packed, then, ask=True: sent.append((packed, then))  # type: ignore
    return sent


def test_the_record_is_released_as_its_lease_is(hub: Hub, redis_client: Any) -> None:
    handed = _handed(redis_client, "thin-release-same")
    by_record, by_lease = HubStore(hub, redis_client, 5.0), HubStore(hub, redis_client, 5.0)
    record_sent, lease_sent = _sent(by_record), _sent(by_lease)
    assert by_record.release_record(handed, lambda moves: None)
    assert by_lease.release(Lease.of_handover(redis_client, handed), lambda moves: None)
    assert [packed for packed, _ in record_sent] == [packed for packed, _ in lease_sent]
    record_then, lease_then = record_sent[0][1], lease_sent[0][1]
    key = handed["keys"][0]
    for replies, wake in (([1, b"1"], ([key], [5000])),  # a line formed meanwhile
                          ([1, None], None), ([0, b"1"], None)):  # none; not removed
        assert record_then.wake_after(*replies) == lease_then.wake_after(*replies) == wake


def test_the_record_release_frees_the_slot_and_wakes_a_line(hub: Hub, redis_client: Any
                                                            ) -> None:
    handed = _handed(redis_client, "thin-release-free")
    key = handed["keys"][0]
    store = HubStore(hub, redis_client, 5.0)
    woken: List[Any] = []
    redis_client.zadd(key, {CONTENDED: 0})  # as if a line formed while the run ran
    sent = store.send

    def watched(packed: bytes, then: Any, ask: bool = True) -> None:
        if b"EVALSHA" in packed or b"EVAL" in packed:
            woken.append(packed)
        sent(packed, then, ask)

    store.send = watched  # type: ignore[method-assign]
    assert store.release_record(handed, lambda moves: None)
    run_until(hub, lambda: bool(woken) and not store.pipeline.pending)
    assert redis_client.zscore(key, handed["member"]) is None
    assert woken, "wake.lua ran after a release that found a line"


@pytest.mark.parametrize("change", [
    {"contended": True}, {"last": True}, {"costs": [2]}, {"parts": [{}]},
])
def test_what_the_record_cannot_release_is_left_to_the_lease(
        hub: Hub, redis_client: Any, change: Dict[str, Any]) -> None:
    handed = {**_handed(redis_client, "thin-release-not"), **change}
    store = HubStore(hub, redis_client, 5.0)
    sent = _sent(store)
    assert store.release_record(handed, lambda moves: None) is False
    assert sent == []
