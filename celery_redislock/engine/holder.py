"""A holder's entry in a semaphore: ``"<token> <acquired_ms> <fence> <description>"``.

The token of a task run is ``"<worker node>|<task id>|<start id>:<random>"`` (the start
id names one start of the worker; tokens of older versions have none); the description is
JSON with the task, its id, the worker, the process id and the run's arguments as
Celery shows them (its ``argsrepr``, cut; see
:mod:`celery_redislock.pool.attempt`). ``admit.lua`` writes the entry; this module
is the one
place that reads it back.

    >>> holder_member("w1@host|task-1|ab.0", 1000, 42, '{"pid": 9}')
    'w1@host|task-1|ab.0 1000 42 {"pid": 9}'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional


def holder_member(token: str, acquired_ms: int, fence: int, description: str) -> str:
    """The entry ``admit.lua`` writes for a holder (it formats the numbers the same way)."""
    return f"{token} {acquired_ms} {fence} {description}"


#: Between a weighted holder's token and the number of one of its units (``units.lua``).
UNIT_MARK = "*"


def unit_members(token: str, cost: int) -> List[str]:
    """The members a holder of ``cost`` slots has beside its holder entry: one unit per
    further slot, ``"<token>*2"`` to ``"<token>*<cost>"``, all with the holder's lease.

        >>> unit_members("ab.1", 3), unit_members("ab.1", 1)
        (['ab.1*2', 'ab.1*3'], [])
    """
    return [f"{token}{UNIT_MARK}{unit}" for unit in range(2, cost + 1)]


def unit_of(member: str) -> Optional[str]:
    """The token (or, for a reservation, ``"~~<n>"``) a unit member belongs to; None
    for any other member. Units are the members without a space that end ``*<n>``.

        >>> unit_of("ab.1*3"), unit_of("~t-1.ab*2"), unit_of("ab.1 1000 7 {}")
        ('ab.1', '~t-1.ab', None)
    """
    if " " in member:
        return None
    base, mark, number = member.rpartition(UNIT_MARK)
    return base if mark and base and number.isdigit() else None


@dataclass(frozen=True)
class Holder:
    """One holder entry of a semaphore, read from its sorted-set member and score.

    ``acquired_ms`` and ``lease_end_ms`` are times on the Redis server's clock (ms).
    """

    token: str
    task_id: Optional[str]
    task: Optional[str]
    worker: Optional[str]
    pid: Optional[int]
    acquired_ms: int
    lease_end_ms: int
    fence: int
    member: str
    #: Slots the holder takes: 1, or a weighted run's cost (its units counted).
    cost: int = 1
    #: The run's arguments as Celery shows them (``argsrepr`` ``kwargsrepr``), if given:
    #: text written by whoever sent the task, to be shown as text only.
    args: Optional[str] = None

    def age(self, now_ms: int) -> float:
        """Seconds since the holder took its slot.

            >>> parse_holder("abc.1 1000 7 ", 31000).age(3500)
            2.5
        """
        return (now_ms - self.acquired_ms) / 1000

    def lease_left(self, now_ms: int) -> float:
        """Seconds left on the lease (negative once it ran out).

            >>> parse_holder("abc.1 1000 7 ", 31000).lease_left(30000)
            1.0
        """
        return (self.lease_end_ms - now_ms) / 1000


def parse_holder(member: Any, score: float) -> Holder:
    """Read a holder member ``"<token> <acquired_ms> <fence> <description>"``.

    The worker and task id come from the description JSON when it has them, else from a
    task run's token ``"<worker>|<task id>|<random>"``; missing parts are None::

        >>> h = parse_holder('w1@host|task-1|ab.0 1000 42 {"task": "proj.t", "pid": 9}', 5e3)
        >>> h.token, h.worker, h.task_id, h.task, h.pid, h.fence, h.lease_end_ms
        ('w1@host|task-1|ab.0', 'w1@host', 'task-1', 'proj.t', 9, 42, 5000)
        >>> parse_holder("ab.1 1000 43 ", 5000).worker is None
        True
    """
    entry = text(member)
    parts = entry.split(" ", 3)
    token = parts[0]
    acquired_ms = _int(parts[1]) if len(parts) > 1 else None
    fence = _int(parts[2]) if len(parts) > 2 else None
    description: Dict[str, Any] = {}
    if len(parts) > 3 and parts[3].strip():
        try:
            loaded = json.loads(parts[3])
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            description = loaded
    worker = task_id = None
    if token.count("|") >= 2:
        worker, task_id = token.split("|")[:2]
    pid = _int(description.get("pid"))
    return Holder(
        token=token,
        task_id=_str(description.get("id")) or task_id or None,
        task=_str(description.get("task")),
        worker=_str(description.get("worker")) or worker or None,
        pid=pid,
        acquired_ms=acquired_ms or 0,
        lease_end_ms=int(score),
        fence=fence or 0,
        member=entry,
        args=_str(description.get("args")),
    )


def text(value: Any) -> str:
    """A Redis reply as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
