"""A parked run whose copy never comes: parked by the process that runs it (a gevent
worker's greenlet, or a pool process), which died between the refusal that wrote its
reference and its copy's publish. Found by the history check (gevent, seed 1 with AOF):
the reference stayed waiting for the 7 days the line's keys live, counted in the line,
and the key space's index of parked lines kept the line with no time to live. Such a
run now asks with ``unsent_ms`` and confirms its copy's publish (``copy_sent``);
unconfirmed, its reference lapses as a claim does (``lua/parked_unsent.lua``): no
longer counted as waiting, then forgotten once no copy can come back. A real redis-server
(the end-to-end test with a real gevent worker killed in that window is in
``test_parking_unsent_worker.py``)."""

from __future__ import annotations

import time
from typing import Any, Tuple

from test_parking_claims import companion, poll_until

from celery_redislock.engine.admission import Busy, Lease, ParkedMove, SlotLimit
from celery_redislock.engine.parked_view import read_parked_lines
from celery_redislock.engine.parking import copy_sent, due, park_admit, parked_index, run_id

PREFIX = "redislock:"


def waiting(client: Any, key: str, anonymous: bool = False) -> int:
    """The references waiting in ``key``'s line (``anonymous``: its anonymous entries)."""
    seconds, micros = client.time()
    line = read_parked_lines(client, [key], seconds * 1000 + micros // 1000).get(key)
    return 0 if line is None else line.anonymous if anonymous else line.references_waiting


def parked_unsent(client: Any, name: str, unsent_ms: int,
                  keep_ms: int = 3600 * 1000) -> Tuple[str, Lease, Busy]:
    """``first`` holds the one slot of ``name``; ``unsent`` is refused and parks, asking
    with ``unsent_ms`` (its copy is to be confirmed): ``(key, first, unsent's Busy)``."""
    limit = [SlotLimit(name, 1, PREFIX)]
    first = park_admit(client, limit, lease=30, run=run_id("first", 0))
    assert isinstance(first, Lease)
    busy = park_admit(client, limit, lease=30, run=run_id("unsent", 0), unsent_ms=unsent_ms,
                      keep_served_ms=keep_ms)
    assert isinstance(busy, Busy) and busy.park is not None
    assert waiting(client, limit[0].key) == 1
    return limit[0].key, first, busy


def test_an_unconfirmed_reference_lapses_then_is_forgotten(redis_client):
    key, first, _ = parked_unsent(redis_client, "unsent-lapse", unsent_ms=200, keep_ms=400)
    refs = companion(key, "pr")
    # Its parking queue holds nothing (the copy never came): the poll counts it 1 while
    # the bound lasts, then not at all.
    poll_until(lambda: waiting(redis_client, key) == 0, redis_client, key)
    assert redis_client.hget(refs, run_id("unsent", 0)).startswith(b"w ")  # kept 'k' ms
    poll_until(lambda: redis_client.hget(refs, run_id("unsent", 0)) is None, redis_client, key)
    assert redis_client.zcard(companion(key, "pu")) == 0
    # Nobody waits: the release hands nothing over, and the index forgets the line.
    assert first.release()
    assert [h for h in first.handoffs if isinstance(h, ParkedMove)] == []
    poll_until(lambda: not redis_client.zscore(parked_index(PREFIX), key), redis_client, key)


def test_a_confirmed_reference_keeps_waiting(redis_client):
    key, first, busy = parked_unsent(redis_client, "unsent-sent", unsent_ms=200)
    assert copy_sent(redis_client, busy.park, run_id("unsent", 0))
    time.sleep(0.3)
    due(redis_client, {key: 1}, prefix=PREFIX)
    assert waiting(redis_client, key) == 1
    assert redis_client.zcard(companion(key, "pu")) == 0
    assert first.release()
    assert [h for h in first.handoffs if isinstance(h, ParkedMove)] == [ParkedMove(key)]


def test_a_late_confirmation_counts_the_reference_again(redis_client):
    key, first, busy = parked_unsent(redis_client, "unsent-late", unsent_ms=200)
    poll_until(lambda: waiting(redis_client, key) == 0, redis_client, key)
    assert copy_sent(redis_client, busy.park, run_id("unsent", 0))  # the store was away
    assert waiting(redis_client, key) == 1
    assert not copy_sent(redis_client, busy.park, run_id("unsent", 0))  # once
    assert first.release()


def test_a_copy_whose_confirmation_was_lost_still_runs(redis_client):
    key, first, busy = parked_unsent(redis_client, "unsent-lost", unsent_ms=200)
    poll_until(lambda: waiting(redis_client, key) == 0, redis_client, key)
    # The copy is in its parking queue (its confirmation alone was lost): the poll
    # counts it as an anonymous entry once the line knows nobody, and hands it the slot.
    assert first.release()
    moves = due(redis_client, {key: 1}, prefix=PREFIX)
    assert moves == [ParkedMove(key)]
    assert waiting(redis_client, key, anonymous=True) == 1
    moved = park_admit(redis_client, [SlotLimit("unsent-lost", 1, PREFIX)], lease=30,
                       run=run_id("unsent", 0), parked=busy.park)
    assert isinstance(moved, Lease)  # not ended as stale: its reference was still known
    assert waiting(redis_client, key) == 0
    assert waiting(redis_client, key, anonymous=True) == 0  # counted once, not twice
    assert redis_client.zcard(companion(key, "pu")) == 0
    assert moved.release()


def test_the_index_of_parked_lines_has_a_time_to_live(redis_client):
    _, first, _ = parked_unsent(redis_client, "unsent-index", unsent_ms=30000)
    assert redis_client.ttl(parked_index(PREFIX)) > 3 * 24 * 3600
    assert first.release()
