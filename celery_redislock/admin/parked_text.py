"""How a key's parked line (``redislock_line = "broker"``) reads in the text views
(``status``, ``inspect``, ``watch``): counts, the parking queue and its length.

    >>> from celery_redislock.engine.parked_view import ParkedLine
    >>> state = LimitState("n", "redislock:{ab}:s:n", 0,
    ...                    parked=ParkedLine("redislock:{ab}:s:n", 0, 5, 1, 1))
    >>> parked_cell(state), parked_summary(state.parked)
    ('?', '6 parked (5 reference(s), 1 anonymous), 1 reserved, 0 claimed, 0 served kept')
"""

from __future__ import annotations

from typing import List

from ..engine.parked_view import ParkedLine
from ..parking import parking_queue
from .state import LimitState

#: How a parked line's reservation (member ``~~<n>`` of the semaphore) shows as a
#: :class:`~.state.Reservation`'s ticket (the member without its first ``~``).
RESERVED_PARKED = "~"


def parked_summary(line: ParkedLine) -> str:
    """The counts of a parked line in words (with a fair limit's sub-lines waiting).

        >>> parked_summary(ParkedLine("k", 0, 4, fair_sub_lines=2)).split(", ")[-1]
        '2 fair sub-line(s) waiting'
    """
    fair = f", {line.fair_sub_lines} fair sub-line(s) waiting" if line.fair_sub_lines else ""
    return (f"{line.waiting} parked ({line.references_waiting} reference(s), "
            f"{line.anonymous} anonymous), {line.reserved} reserved, {line.claimed} "
            f"claimed, {line.served} served kept{fair}")


def parked_cell(state: LimitState) -> str:
    """The PARKED column: the messages in the key's parking queue (``?``: the broker
    could not be asked), ``-`` for a key without a parked line.

        >>> parked_cell(LimitState("n", "k", 0))
        '-'
    """
    if state.parked is None:
        return "-"
    return "?" if state.parked_messages is None else str(state.parked_messages)


def reservation_for(ticket: str) -> str:
    """Whom a reservation is for: a run moved out of parking (the parked line's
    reservations are numbered, their members ``~~<n>``); anything else (kept by an
    earlier release's line until it runs out) by its name.

        >>> reservation_for("~7"), reservation_for("t-1.ab")
        ('a run moved out of parking (#7)', 'reservation t-1.ab')
    """
    if ticket.startswith(RESERVED_PARKED):
        return f"a run moved out of parking (#{ticket[len(RESERVED_PARKED):]})"
    return f"reservation {ticket}"


def parked_lines(state: LimitState) -> List[str]:
    """``inspect``'s lines about the parked line of a key (none without one)."""
    line = state.parked
    if line is None:
        return []
    queue = parking_queue(state.key)
    length = ("length unknown (broker not asked)" if state.parked_messages is None
              else f"{state.parked_messages} message(s) in the broker")
    age = line.last_parked_age
    return [f"parked line: {parked_summary(line)}",
            f"parking queue: {queue}, {length}",
            "last parked: " + ("-" if age is None else f"{age:.1f}s ago")
            + "; oldest waiter's age: not kept by the lock store"]
