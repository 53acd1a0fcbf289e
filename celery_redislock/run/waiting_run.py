"""A waiting run: what its wait has been so far, read from and written to its message.

A run that was not admitted goes back to the broker (see
:mod:`celery_redislock.line.waiting`), and its wait so far travels with the copy
sent back, in the ``redislock_wait`` message header. This module alone reads that
header (:meth:`WaitingRun.of`) and writes it (:meth:`WaitingRun.header`); everyone else
sees a :class:`WaitingRun`.

The header is data from the broker: it is read as plain values, never run, and a field
that is missing or not of its type reads as its default (a run that has not waited).
"""

from __future__ import annotations

import math
from collections import abc
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Mapping, Optional

from ..parking.naming import WAIT_HEADER


@dataclass(frozen=True)
class WaitingRun:
    """The wait of one run so far, as its message carries it.

    * ``since``: when the run was first refused (ms, the Redis server's clock), or None
      (it has not been refused, or the lock store was not reached then);
    * ``attempts``: how many times it was refused;
    * ``promises``: the starts (µs) rate limiters promised it, by the limiter's key;
    * ``follows``: the earlier run of its task id it follows (the semaphore ``key`` and
      ``name``, the holder ``member``, ``since`` and ``until``), or None;
    * ``park_id`` and ``line`` (the parking line, ``redislock_line = "broker"``): this
      copy's park id and the semaphore key whose parking queue held it ("" for none: a
      header without them, version 1, is read as a run never parked);
    * ``move``: the id of this moved copy (written by the broker side: when parked on a
      Redis broker, where a parked message moves once; when moved on RabbitMQ), which no
      other copy of the run carries; "" for none.

    A header an older worker wrote may have more fields (``ticket``, ``copy``,
    ``express``: the retired "store" line's): they are not read, and not written back.

    Read from a request, written back as a header:

        >>> run = WaitingRun.of_headers({"redislock_wait": {"since": 1700000000000,
        ...                                                 "attempts": 2, "ticket": "t.1"}})
        >>> run.since, run.attempts, run.carried
        (1700000000000, 2, True)
        >>> run.header()
        {'since': 1700000000000, 'attempts': 2, 'promises': {}}
        >>> WaitingRun.of_headers({"redislock_wait": {"attempts": "many"}}).attempts
        0
        >>> WaitingRun.of_headers({}) == NOT_WAITING
        True
    """

    since: Optional[int] = None
    attempts: int = 0
    promises: Mapping[str, int] = field(default_factory=dict)
    follows: Optional[Mapping[str, Any]] = None
    park_id: str = ""
    line: str = ""
    move: str = ""
    #: The message had a wait header with something in it (even unreadable).
    carried: bool = False

    @classmethod
    def of(cls, request: Any) -> WaitingRun:
        """The wait of ``request`` (a task's request or context), from its headers."""
        return cls.of_headers(getattr(request, "headers", None))

    @classmethod
    def of_headers(cls, headers: Any) -> WaitingRun:
        """The wait that message ``headers`` carry: :data:`NOT_WAITING` without one."""
        if type(headers) is dict:  # as a message's headers are (the common case, fast)
            state = headers.get(WAIT_HEADER)
        else:
            state = headers.get(WAIT_HEADER) if isinstance(headers, abc.Mapping) else None
        return cls.parse(state) if state else NOT_WAITING

    @classmethod
    def parse(cls, state: Any) -> WaitingRun:
        """A wait header's value as a :class:`WaitingRun`; any field missing or not of
        its type reads as its default, and anything but a dict as no wait.

            >>> run = WaitingRun.parse({"since": "soon", "promises": {"k": 5, "j": "x"}})
            >>> run.since, run.promises, run.carried
            (None, {'k': 5}, True)
            >>> WaitingRun.parse(["not", "a", "dict"]).carried
            False
        """
        if not isinstance(state, dict) or not state:
            return NOT_WAITING
        return cls(since=_number(state.get("since")), attempts=_count(state.get("attempts")),
                   promises=_promises(state.get("promises")),
                   follows=_follows(state.get("follows")), park_id=_text(state.get("park_id")),
                   line=_text(state.get("line")), move=_text(state.get("move")),
                   carried=True)

    def header(self) -> Dict[str, Any]:
        """The ``redislock_wait`` header's value for this wait (only plain values)."""
        wait: Dict[str, Any] = {"since": self.since, "attempts": self.attempts,
                                "promises": dict(self.promises)}
        if self.follows:
            wait["follows"] = dict(self.follows)
        if self.park_id:
            wait.update(v=2, park_id=self.park_id, line=self.line)
        if self.move:
            wait["move"] = self.move
        return wait

    @property
    def parked(self) -> bool:
        """Whether this copy was moved out of a parking queue (it names its park id).

            >>> WaitingRun.parse({"v": 2, "park_id": "7:1", "line": "k"}).parked
            True
        """
        return bool(self.park_id and self.line)

    def on(self, headers: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        """``headers`` (a message's), with this wait as their wait header.

            >>> WaitingRun(attempts=1).on({"x": 1})
            {'x': 1, 'redislock_wait': {'since': None, 'attempts': 1, 'promises': {}}}
        """
        return {**(headers or {}), WAIT_HEADER: self.header()}

    def put_on(self, request: Any) -> None:
        """Make this the wait of ``request`` (its ``headers`` replaced)."""
        request.headers = self.on(getattr(request, "headers", None))

    def but(self, **changes: Any) -> WaitingRun:
        """This wait with ``changes``.

            >>> WaitingRun(attempts=1).but(park_id="7:1").park_id
            '7:1'
        """
        return replace(self, carried=True, **changes)


#: The wait of a run that has not waited.
NOT_WAITING = WaitingRun()


def carries_wait(headers: Any) -> bool:
    """Whether message ``headers`` have a wait header (a copy of a waiting run's message).

        >>> carries_wait({"redislock_wait": {}}), carries_wait({}), carries_wait(None)
        (True, False, False)
    """
    if type(headers) is dict:  # as a message's headers are (the common case, fast)
        return WAIT_HEADER in headers
    return isinstance(headers, abc.Mapping) and WAIT_HEADER in headers


def without_wait(headers: Any) -> Any:
    """``headers`` without their wait header (the same object when they have none).

        >>> without_wait({"a": 1, "redislock_wait": {"attempts": 1}})
        {'a': 1}
    """
    if not isinstance(headers, dict) or WAIT_HEADER not in headers:
        return headers
    return {key: value for key, value in headers.items() if key != WAIT_HEADER}


def _number(value: Any) -> Optional[int]:
    """A time in ms; None for none (0 included, as a wait since 0 is none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) or None


def _count(value: Any) -> int:
    """A count as ``int()`` reads it; 0 when it cannot."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _promises(value: Any) -> Dict[str, int]:
    """The promised starts, keeping the entries that are a key and a number of µs."""
    if not isinstance(value, Mapping):
        return {}
    return {key: int(start) for key, start in value.items()
            if isinstance(key, str) and isinstance(start, (int, float))
            and not isinstance(start, bool) and math.isfinite(start)}


def _follows(value: Any) -> Optional[Dict[str, Any]]:
    """The earlier run followed: its semaphore's ``key``, the holder ``member`` and the
    end of its lease seen last (``until``, ms) at the least, and only plain values; None
    for anything else (the run then asks as any run)."""
    if not isinstance(value, Mapping) or not value:
        return None
    earlier = {key: item for key, item in value.items() if isinstance(key, str)
               and (item is None or isinstance(item, (str, int, float)))}
    readable = (isinstance(earlier.get("key"), str) and isinstance(earlier.get("member"), str)
                and _number(earlier.get("until")) is not None)
    return earlier if readable else None
