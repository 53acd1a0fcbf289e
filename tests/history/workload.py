"""The task kinds of the history check, and a seed's plan of the tasks to send.

Each kind is one limit shape. Every kind has two tasks: ``late`` (``acks_late`` with
``reject_on_worker_lost``) and ``early`` (Celery's default acks); the plan sends half of
each. Two kinds are there for the lock store's restarts: ``long30`` (one slot, a 30 s
lease renewed every 10 s, a body in four of 12-20 s, the others short newcomers that ask
at any moment) beside the 3 s and 6 s leases of the others, and
``long6`` (one slot, a 6 s lease, 15 s bodies): bodies that outlive their lease many
times over, so a lease nobody renews, or a grace shorter than a holder's lease, shows as
two bodies at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class Kind:
    """One limit shape: its key template, limits, lease and how long its bodies work."""

    name: str
    #: ``lock_key``, over the task's ``key`` argument.
    key: str
    #: How many keys its tasks spread over.
    keys: int
    slots: Optional[int]
    lease: float
    seconds: Tuple[float, float]
    #: Tasks of this kind per 100 sent (the long kinds: see :func:`plan`).
    share: int
    rate: Optional[Tuple[int, float]] = None  # (count, period in seconds)
    burst: int = 1
    #: Weighted runs: a cost drawn from this range, given as the ``cost`` argument.
    costs: Tuple[int, int] = (1, 1)
    #: If given, three bodies in four work this long instead: newcomers that come and go
    #: while the long ones hold the slot, so that some ask at any moment.
    quick: Optional[Tuple[float, float]] = None

    def draw_seconds(self, rng: random.Random, index: int) -> float:
        """How long the ``index``-th body of this kind works."""
        quick = self.quick is not None and index % 4 != 0
        return round(rng.uniform(*(self.quick if quick and self.quick else self.seconds)), 3)

    def task_name(self, acks_late: bool) -> str:
        return f"history.{self.name}.{'late' if acks_late else 'early'}"

    def key_of(self, index: int) -> str:
        return self.key.format(key=index)

    def limits(self, index: int, cost: int) -> List[Dict[str, Any]]:
        """The slot limits of a task of this kind on key ``index`` (for the checker), with
        the lease's length in µs."""
        if self.slots is None:
            return []
        return [{"key": self.key_of(index), "slots": self.slots, "cost": cost,
                 "lease_us": int(self.lease * 1e6)}]

    def rate_limit(self, index: int) -> Optional[Dict[str, Any]]:
        """The rate limit of a task of this kind on key ``index`` (for the checker)."""
        if self.rate is None:
            return None
        count, period = self.rate
        return {"key": self.key_of(index), "count": count, "period_us": int(period * 1e6),
                "burst": self.burst}


KINDS: Tuple[Kind, ...] = (
    Kind("slot", "slot:{key}", 6, 2, 6.0, (0.1, 1.5), share=34),
    Kind("shared", "shared", 1, 3, 6.0, (0.1, 1.0), share=22),
    Kind("rate", "rate", 1, None, 6.0, (0.02, 0.2), share=20, rate=(4, 1.0)),
    Kind("weighted", "gpu", 1, 4, 6.0, (0.2, 1.5), share=14, costs=(1, 3)),
    Kind("short", "short:{key}", 2, 1, 3.0, (0.5, 4.0), share=10),
    Kind("long30", "long30", 1, 1, 30.0, (12.0, 20.0), share=0, quick=(0.1, 0.5)),
    Kind("long6", "long6", 1, 1, 6.0, (15.0, 15.0), share=0),
)

KIND = {kind.name: kind for kind in KINDS}

#: The shortest lease of any kind: SIGSTOPs and pauses stay below half of it.
SHORTEST_LEASE = min(kind.lease for kind in KINDS)


@dataclass(frozen=True)
class Send:
    """One task to send: when (seconds after the start), what, and with what arguments."""

    at: float
    kind: str
    acks_late: bool
    key: int
    seconds: float
    cost: int

    @property
    def name(self) -> str:
        return KIND[self.kind].task_name(self.acks_late)


def plan(seed: int, tasks: int, window: float) -> List[Send]:
    """The ``tasks`` sends of ``seed``, spread over ``window`` seconds, by send time.

    The long kinds get a few tasks each, about as many as fit in the window end to end, so
    that their one slot has a holder all through the faults: ``long6``'s sent in the window's
    first fifth (a backlog), ``long30``'s all through it (newcomers ask at any moment,
    also just after the lock store came back).
    """
    rng = random.Random(f"plan-{seed}")
    longs = {"long30": max(4, int(window / 5)), "long6": max(2, int(window / 15))}
    names = [name for name, count in longs.items() for _ in range(count)]
    weights = [kind.share for kind in KINDS]
    names += rng.choices([kind.name for kind in KINDS], weights, k=tasks - len(names))
    sends = []
    of_kind: Dict[str, int] = {}
    for index, name in enumerate(names):
        of_kind[name] = of_kind.get(name, 0) + 1
        kind = KIND[name]
        at = rng.uniform(0, window * (0.2 if name == "long6" else 0.85))
        sends.append(Send(at=round(at, 3), kind=name, acks_late=index % 2 == 0,
                          key=rng.randrange(kind.keys),
                          seconds=kind.draw_seconds(rng, of_kind[name] - 1),
                          cost=rng.randint(*kind.costs)))
    return sorted(sends, key=lambda send: send.at)
