"""A lock store that answers at once and costs nothing, for measuring the package's own
share of a run: with ``BENCH_FAKE_STORE=1`` in a worker's environment, the peer
benchmark's app (:mod:`benchmarks.peers_app`) installs it in the worker, so that every
admission of this package's kinds is granted by Python code, with no request to Redis
(a lease with slots, fence and times as the script would give), and every release that
would ride with the next request is dropped.

What is left of the cost over a plain task is then the package's Python code and the
hand-over of the lease to the pool process: the floor that no faster lock store can go
below. Never use this outside a benchmark: it admits every run.

With ``BENCH_FAKE_STORE=ping`` every admission first makes one bare round trip to the
real lock store (a ``PING`` on the same connection, waited for) and is then granted as
above: the package's code and a round trip, without the script's work in Redis. Against
the real store, that tells the round trip's cost from the script's.

    BENCH_FAKE_STORE=1 python -m benchmarks.bench_peers --kinds slots --tasks 300
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, List, Mapping, Sequence

from celery_redislock.engine import admission
from celery_redislock.engine.channel import channel_for

#: The worker's environment variable that installs it: ``"1"`` (no request at all) or
#: ``"ping"`` (one bare round trip per admission).
ENV = "BENCH_FAKE_STORE"
#: Its values, by ``--fake-store``'s.
MODES = {"free": "1", "ping": "ping"}

_fences = itertools.count()


def _granted(client: Any, limiters: Sequence[Any], token: str, lease: float,
             description: str, promises: Mapping[str, int], ticket: Any, reserve_ms: int,
             probe: bool = False, book_ms: int = 0) -> Any:
    """``admit.lua``'s answer for an uncontended run, without asking: admitted now."""
    now_ms = int(time.time() * 1000)
    lease_ms = admission.milliseconds(lease)
    return admission._lease(client, limiters, token, lease, description, reserve_ms, now_ms,
                            now_ms + lease_ms, now_ms * 1000 + next(_fences), 0, 0, [])


def _granted_after_ping(client: Any, limiters: Sequence[Any], token: str, lease: float,
                        description: str, promises: Mapping[str, int], ticket: Any,
                        reserve_ms: int, probe: bool = False, book_ms: int = 0) -> Any:
    """:func:`_granted`, after one bare round trip to the lock store (which also writes
    the releases left to ride with it, as a real admission would)."""
    channel = channel_for(client)
    if channel is not None:
        channel.call("PING")
    else:
        client.ping()
    return _granted(client, limiters, token, lease, description, promises, ticket,
                    reserve_ms, probe, book_ms)


def _dropped(self: Any, on_handoffs: Callable[[List[Any]], None], *,
             with_next_request: bool = False) -> None:
    """A release sent with the next request: nothing to send."""


def install(mode: str = "1") -> None:
    """Grant every admission of this process without the lock store's script (see
    above): ``mode`` ``"1"`` with no request, ``"ping"`` after a bare round trip."""
    if mode == "ping":
        admission._admit_group = _granted_after_ping  # type: ignore[assignment]
    else:
        admission._admit_group = _granted  # type: ignore[assignment]
        admission.Lease.release_soon = _dropped  # type: ignore[method-assign]
