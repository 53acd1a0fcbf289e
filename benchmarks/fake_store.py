"""A lock store that answers at once and costs nothing, for measuring the package's own
share of a run: with ``BENCH_FAKE_STORE=1`` in a worker's environment, the peer
benchmark's app (:mod:`benchmarks.peers_app`) installs it in the worker, so that every
admission of this package's kinds is granted by Python code, with no request to Redis
(a lease with slots, fence and times as the script would give), and every release that
would ride with the next request is dropped.

What is left of the cost over a plain task is then the package's Python code and the
hand-over of the lease to the pool process: the floor that no faster lock store can go
below. Never use this outside a benchmark: it admits every run.

    BENCH_FAKE_STORE=1 python -m benchmarks.bench_peers --kinds slots --tasks 300
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, List, Mapping, Sequence

from celery_redislock.engine import admission

#: The worker's environment variable that installs it (``"1"``).
ENV = "BENCH_FAKE_STORE"

_fences = itertools.count()


def _granted(client: Any, limiters: Sequence[Any], token: str, lease: float,
             description: str, promises: Mapping[str, int], ticket: Any, reserve_ms: int,
             probe: bool = False, book_ms: int = 0) -> Any:
    """``admit.lua``'s answer for an uncontended run, without asking: admitted now."""
    now_ms = int(time.time() * 1000)
    lease_ms = admission.milliseconds(lease)
    return admission._lease(client, limiters, token, lease, description, reserve_ms, now_ms,
                            now_ms + lease_ms, now_ms * 1000 + next(_fences), 0, 0, [])


def _dropped(self: Any, on_handoffs: Callable[[List[Any]], None], *,
             with_next_request: bool = False) -> None:
    """A release sent with the next request: nothing to send."""


def install() -> None:
    """Grant every admission of this process without the lock store (see above)."""
    admission._admit_group = _granted  # type: ignore[assignment]
    admission.Lease.release_soon = _dropped  # type: ignore[method-assign]
