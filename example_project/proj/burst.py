"""The demo's burst: which tasks it sends, and the limit key each of them runs under.

Every task sent is a :class:`Sent`; the limit keys they name, with the limit each one
holds to and how many runs were sent to it, are :class:`Limit` objects, read from the
package's own view of the task (``task.task_limits()``), so the keys and limits shown are
the ones the workers enforce.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Sequence

from celery_redislock.config.settings import read_settings
from celery_redislock.engine.admission import RateLimit, SlotLimit
from celery_redislock.engine.rate import Rate

CRAWLS = 16
CUSTOMERS = 4
SYNCS_PER_CUSTOMER = 6
REBUILDS = 6
PARTNER_PINGS = 20


@dataclass(frozen=True)
class Limit:
    """One limit key: at most ``slots`` runs at once and/or ``rate`` starts, and how many
    runs of it the burst sent."""

    name: str
    slots: Optional[int]
    rate: Optional[Rate]
    semaphore: Optional[str]  # the Redis key of its semaphore, if it has a slot limit
    sent: int

    @property
    def label(self) -> str:
        """The limit in a few characters: ``"2 slots"``, ``"4/s"``."""
        if self.slots is not None:
            return f"{self.slots} slot{'s' if self.slots != 1 else ''}"
        assert self.rate is not None
        period = "s" if self.rate.period == 1 else f"{self.rate.period:g}s"
        return f"{self.rate.count:g}/{period}"

    @property
    def most_starts(self) -> Optional[int]:
        """The most starts a rate limit allows in any window of its period."""
        return None if self.rate is None else int(self.rate.count) + self.rate.burst


@dataclass(frozen=True)
class Sent:
    """A task the demo sent, how to show it, and the limit key it runs under."""

    call: str
    limit_key: str
    result: Any  # celery.result.AsyncResult


def calls() -> List[tuple]:
    """The burst, in the order it is sent: ``(task name, args, kwargs, shown as)``."""
    burst: List[tuple] = []
    for n in range(CRAWLS):
        url = f"https://example.com/page/{n}"
        burst.append(("crawl", (url,), {}, f"crawl({url!r})"))
    for n in range(CUSTOMERS * SYNCS_PER_CUSTOMER):
        customer = n % CUSTOMERS + 1
        # By keyword or by position: the lock key binds arguments by name.
        args, kwargs = ((), {"customer_id": customer, "full": True}) if n % 2 else ((customer,), {})
        burst.append(("sync_customer", args, kwargs, f"sync_customer({customer})"))
    for _ in range(REBUILDS):
        burst.append(("rebuild_index", (), {}, "rebuild_index()"))
    for _ in range(PARTNER_PINGS):
        burst.append(("ping_partner", ("acme",), {}, "ping_partner('acme')"))
    return burst


def limit_of(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Limit:
    """The limit key one call of ``task`` runs under (one per task in this project)."""
    prefix = read_settings(task.app).prefix
    limiters = task.task_limits().limiters(args, kwargs, prefix)
    slots = next((lim for lim in limiters if isinstance(lim, SlotLimit)), None)
    rate = next((lim for lim in limiters if isinstance(lim, RateLimit)), None)
    return Limit(
        name=limiters[0].name,
        slots=slots.slots if slots else None,
        rate=rate.rate if rate else None,
        semaphore=slots.key if slots else None,
        sent=0,
    )


def send_burst(tasks: ModuleType) -> tuple[List[Sent], List[Limit]]:
    """Send the burst; return what was sent and the limit keys, in order of first use."""
    sent: List[Sent] = []
    limits: Dict[str, Limit] = {}
    counts: Dict[str, int] = {}
    for task_name, args, kwargs, shown in calls():
        task = getattr(tasks, task_name)
        limit = limit_of(task, args, kwargs)
        limits.setdefault(limit.name, limit)
        counts[limit.name] = counts.get(limit.name, 0) + 1
        sent.append(Sent(shown, limit.name, task.apply_async(args, kwargs)))
    return sent, [_with_sent(limit, counts[name]) for name, limit in limits.items()]


def _with_sent(limit: Limit, sent: int) -> Limit:
    return Limit(limit.name, limit.slots, limit.rate, limit.semaphore, sent)
