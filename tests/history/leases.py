"""Renewals of the bodies' leases, and the one known cause of a key taken past its slots.

A lease that nobody renews ends ``lease`` after it was last written: the slot then goes
to the next run, and a holder still running (stopped, or starved of CPU so long that its
lease keeper ran no renewal for a whole lease) runs beside it until its body ends or a
renewal finds the lease gone. That is the documented limit of leases
(docs/reliability.md), not a defect of the package; the history proves it with the
renewals each process records (``renewal`` events, see :mod:`.app`):

``renewal``  ``key``, ``fence``, ``token`` (the holder's), ``lease_s``, ``outcome``
             (``renewed``, ``lost``: the lease had ended, ``error``: no answer, or an
             error), ``pid``; ``t`` minus ``sent_ago_us`` / ``answered_ago_us`` is no
             earlier than when the request was sent / its answer read

A body's lease was written last, at the latest, at the latest of:

* its start (the lease's admission, hand-on or adoption was sent before the body
  started), later by the time the lock store was stopped or paused since (a request
  written before a stop is served at its end);
* the answer of each of its successful renewals (one answered after the moment looked
  at means the lease was alive then: a renewal never revives an ended lease);
* the answer of each renewal that failed with an error, later by the time the store was
  stopped or paused between its send and the moment looked at (the request may still
  have been served; one sent after that moment may have found the lease alive).

A body whose lease was written last longer than a lease before a moment had no lease
then (:func:`unrenewed_for`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

Event = Mapping[str, Any]

#: A span of time (from, to), in µs.
Span = Tuple[int, int]

#: How a key taken past its slots because a holder's lease ran out unrenewed is reported.
UNRENEWED_CAUSE = "lease expired unrenewed (starved/stopped holder)"

#: The faults during which the lock store serves no request.
STORE_STALLS = ("stop_store", "client_pause")

RENEWED, LOST, ERROR = "renewed", "lost", "error"


@dataclass(frozen=True)
class Renewal:
    """One recorded renewal: when it was sent and answered (µs, the recorder's clock)."""

    key: str
    fence: str
    token: str
    lease_us: int
    outcome: str
    sent: int
    answered: int
    pid: int = 0


def collect_renewals(history: Sequence[Event]) -> Dict[str, List[Renewal]]:
    """The recorded renewals by holder token, each list by time sent.

        >>> found = collect_renewals([{"kind": "renewal", "t": 5_000, "key": "k",
        ...     "fence": "3", "token": "ab", "lease_s": 3.0, "outcome": "renewed",
        ...     "sent_ago_us": 900, "answered_ago_us": 100, "pid": 7}])
        >>> found["ab"][0].sent, found["ab"][0].answered, found["ab"][0].lease_us
        (4100, 4900, 3000000)
    """
    found: Dict[str, List[Renewal]] = defaultdict(list)
    for event in history:
        if event["kind"] != "renewal":
            continue
        moment = int(event["t"])
        found[str(event.get("token"))].append(Renewal(
            key=str(event.get("key", "")), fence=str(event.get("fence", "")),
            token=str(event.get("token")), lease_us=int(float(event["lease_s"]) * 1e6),
            outcome=str(event["outcome"]), sent=moment - int(event.get("sent_ago_us", 0)),
            answered=moment - int(event.get("answered_ago_us", 0)),
            pid=int(event.get("pid") or 0)))
    for renewals in found.values():
        renewals.sort(key=lambda renewal: renewal.sent)
    return dict(found)


def stalls_of(faults: Sequence[Event]) -> List[Span]:
    """The spans (from, to) in µs in which the lock store was stopped or paused."""
    return [(int(fault["t"]), int(fault["t"]) + int(float(fault.get("duration") or 0) * 1e6))
            for fault in faults if fault.get("fault") in STORE_STALLS]


def stalled_after(stalls: Sequence[Span], since: int, until: int) -> int:
    """How long (µs) the store was stalled between ``since`` and ``until``.

        >>> stalled_after([(10, 20), (30, 50)], 15, 40)
        15
    """
    return sum(max(0, min(end, until) - max(begin, since)) for begin, end in stalls)


def last_written(start: int, renewals: Sequence[Renewal], moment: int,
                 stalls: Sequence[Span]) -> int:
    """The latest moment (µs) the lease of a body that started at ``start`` may have been
    written, looking from ``moment``: see the module's doc. A successful renewal answered
    after ``moment`` gives its answer (after ``moment``: the lease was alive then)."""
    latest = start + stalled_after(stalls, start, moment)
    for renewal in renewals:
        if renewal.outcome == RENEWED:
            latest = max(latest, renewal.answered)
        elif renewal.outcome == ERROR:
            latest = max(latest, renewal.answered
                         + stalled_after(stalls, renewal.sent, moment))
    return latest


def unrenewed_for(start: int, token: Optional[str], lease_us: Optional[int], moment: int,
                  renewals: Mapping[str, Sequence[Renewal]],
                  stalls: Sequence[Span]) -> Optional[int]:
    """How long (µs) before ``moment`` the lease of a body (started at ``start``, holder
    ``token``, a lease of ``lease_us``) was written last, when that is longer than its
    lease: it had no lease then. None when it may still have had one, or when the
    history cannot tell (no token or lease length recorded).

        >>> unrenewed_for(0, "ab", 3_000_000, 4_000_000, {}, [])
        4000000
        >>> early = Renewal("k", "1", "ab", 3_000_000, RENEWED, 900_000, 1_000_000)
        >>> unrenewed_for(0, "ab", 3_000_000, 4_000_000, {"ab": [early]}, []) is None
        True
    """
    if not token or not lease_us:
        return None
    gap = moment - last_written(start, renewals.get(token, ()), moment, stalls)
    return gap if gap > lease_us else None


def renewals_told(renewals: Sequence[Renewal], moment: int, origin: int) -> str:
    """The renewals of one holder in words: the last three sent before ``moment``, and
    how many after, times in s from ``origin``, for a report.

        >>> renewals_told([Renewal("k", "1", "ab", 3_000_000, RENEWED, 1_000_000,
        ...     1_002_000)], 5_000_000, 0)
        'renewals before: renewed +1.000-1.002 s; after: 0'
    """
    before = [renewal for renewal in renewals if renewal.sent < moment]
    told = [f"{renewal.outcome} +{(renewal.sent - origin) / 1e6:.3f}-"
            f"{(renewal.answered - origin) / 1e6:.3f} s" for renewal in before[-3:]]
    earlier = f"{len(before) - 3} earlier, " if len(before) > 3 else ""
    after = [renewal.outcome for renewal in renewals if renewal.sent >= moment]
    return (f"renewals before: {earlier}{', '.join(told) or 'none'}; "
            f"after: {len(after)}{' (' + ', '.join(after) + ')' if after else ''}")


def longest_unwritten(start: int, until: int, renewals: Sequence[Renewal]) -> Span:
    """The longest a body's lease went without a write while the body ran (µs), between
    its start, the answers of its successful renewals and its end, and from when.

        >>> answered = Renewal("k", "1", "ab", 3_000_000, RENEWED, 900_000, 1_000_000)
        >>> longest_unwritten(0, 3_500_000, [answered])
        (2500000, 1000000)
    """
    writes = sorted([start, *(renewal.answered for renewal in renewals
                              if renewal.outcome == RENEWED and start < renewal.answered < until)])
    return max((later - earlier, earlier) for earlier, later in zip(writes, [*writes[1:], until]))


def outcomes(renewals: Mapping[str, Sequence[Renewal]]) -> Dict[str, int]:
    """How many renewals had each outcome."""
    counts = {RENEWED: 0, LOST: 0, ERROR: 0}
    for held in renewals.values():
        for renewal in held:
            counts[renewal.outcome] = counts.get(renewal.outcome, 0) + 1
    return counts
