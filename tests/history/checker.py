"""The model check over a history: pure functions of its events, no Redis, no Celery.

A history is a list of event dicts (see :mod:`.events`), each with ``kind`` and ``t``
(the recorder's server clock, µs). The kinds the checker reads:

``sent``     ``task``, ``name`` (the task kind), ``acks_late``, ``limits``: a list of
             ``{"key", "slots", "cost", "lease_us"}``, ``rate``: ``{"key", "count", "period_us",
             "burst"}`` or None
``start``    a body began: ``task``, ``run`` (unique per body), ``pid``, ``worker``,
             ``admitted_ms`` (the admission's start on the lock store's clock, ms),
             ``redelivered`` (its message came back from the broker unacknowledged),
             ``copy`` (its message is one the package sent: it carries its headers;
             false for the message the task was sent as), ``token`` (its lease's holder)
``end``      that body ended, however (``run``)
``fault``    ``fault`` (its kind), ``pids`` (processes it SIGKILLed), ``worker`` (a
             worker it killed whole), ``data_lost`` (a lock store restart that lost its
             data)
``final``    ``task``, ``state``, ``error`` (the exception's name for a failure)
``settle``   once everything has settled: ``held`` (slots still held, per key),
             ``no_ttl`` (lock store keys without a time to live), ``parked`` (the
             parking line's leftovers: messages in parking lists, parked line counts),
             ``unacked_tasks`` (the tasks of the messages still in the broker's
             ``unacked`` hash: delivered, neither acknowledged nor restored)
``run``      the run's set-up: ``persistence`` (``aof``: the lock store keeps its data),
             ``renewals`` (the workers record every renewal)
``lease_lost`` a renewal found a running body's lease ended (the signal)
``renewal``  a renewal of a body's lease (see :mod:`.leases`): a key taken past its slots
             because a holder's lease ran out unrenewed is a known cause, not a defect
``served``   a delivery of ``task`` ended without running, another copy of its message
             having run it (the package's DEBUG line; read to say why a run was lost)
``received`` a worker's main process received a delivery of ``task`` (Celery's
             ``task_received``, every copy and redelivery): ``worker`` (node name),
             ``pid``, ``redelivered``
``accepted`` a pool process accepted that delivery (``Request.on_accepted``, recorded
             just before Celery acknowledges a default-acks run there): ``worker``, ``pid``
             (the worker's main process)
``lock_contended``, ``rate_limited``  a delivery of ``task`` was refused and sent back
             to wait (the signals, sent once the waiting copy is published and before
             the refused message is acknowledged), by process ``pid``

What counts as a defect is in :meth:`Verdict.defects`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from celery_redislock.run.decide import SHORT_WAIT

from .leases import (
    LOST,
    UNRENEWED_CAUSE,
    Renewal,
    collect_renewals,
    last_written,
    longest_unwritten,
    outcomes,
    renewals_told,
    stalls_of,
    unrenewed_for,
)

Event = Mapping[str, Any]

#: A body that never ended and was never killed is open until the history ends.
OPEN = float("inf")

#: Celery's final states.
FINAL_STATES = ("SUCCESS", "FAILURE", "REVOKED")

#: The failure of a body whose pool process was killed (default acks): Celery's own.
WORKER_LOST = "WorkerLostError"

#: How a known cause is reported: the redesign that removes it.
KNOWN_CAUSE = "known: issue 'one copy of every run'"

#: A whole-worker kill from this long before a task's ``sent`` record to this long after
#: it (µs) may fall in kombu's window between the ``BRPOP`` that took the message the
#: task was sent as off its queue (an idle worker's ``BRPOP`` is served at the publish;
#: Redis serves it to a killed worker's socket it has not yet seen closed) and the write
#: of the message to ``unacked`` once the worker's main process reads the reply (under
#: load, its event loop reads it a few hundred ms late). The kill's record trails the
#: kill and the exit of every process of the worker (a pool process forked after the
#: worker connected holds its broker connection too); the ``sent`` record comes before
#: the publish.
POP_WINDOW = (-100_000, 1_000_000)

#: How the known cause of a lost run is reported (see :func:`classify_lost`).
LOST_KNOWN_CAUSE = ("its last receiver killed whole before the body, the message still "
                    "unacknowledged and not restored")

#: The two known causes of a repeated body (see :func:`why_again`).
AFTER_EMPTY_RESTART = "the lock store came back empty"
KILLED_BEFORE_ACK = "its worker killed between a refusal's waiting copy and the ack"

#: The furthest ahead of its admission a rate limiter books a run's start (µs): the
#: longest a run promised a start waits for it in the worker. The limiter's state counts
#: a booked start when it books it, up to this long before the start.
BOOK_AHEAD = int(SHORT_WAIT * 1_000_000)

#: The events that record a refused delivery sent back to wait.
REFUSALS = ("lock_contended", "rate_limited")

#: How long (µs) after a refusal's record a whole-worker kill still falls before the
#: refused message's acknowledgement: the worker's main process acknowledges it right
#: after the record, in the same thread; this covers a worker stopped meanwhile (a
#: SIGSTOP lasts under half the shortest lease, 1.5 s) and the time between a kill and
#: its own record.
ACK_WINDOW = 2_000_000


@dataclass
class Body:
    """One run of a task's body: from its start to its end, or to the fault that killed it."""

    task: str
    run: str
    pid: int
    worker: str
    start: int
    admitted_ms: Optional[int] = None
    end: Optional[int] = None
    #: Its message came back from the broker unacknowledged; None when not recorded.
    redelivered: Optional[bool] = None
    #: Its message is a copy the package sent (None when not recorded).
    copy: Optional[bool] = None
    #: When a fault SIGKILLed its process while it ran (µs), if one did.
    killed: Optional[int] = None
    #: Its lease's holder token (None when not recorded).
    token: Optional[str] = None

    @property
    def until(self) -> float:
        """When it stopped running: its end, its kill, or never seen to (:data:`OPEN`)."""
        if self.end is not None:
            return self.end
        return self.killed if self.killed is not None else OPEN


@dataclass
class Peak:
    """The most slots of one key taken by bodies running at once, against its slots."""

    key: str
    slots: int
    most: int
    at: int = 0
    runs: Tuple[str, ...] = ()

    @property
    def over(self) -> bool:
        return self.most > self.slots


@dataclass
class Overlap:
    """A body that started while its key's slots were all taken: ``taken`` of ``slots``
    at ``at`` (µs), by ``runs``; ``unrenewed``: those whose lease had then been written
    last longer than a lease before (run -> µs since), ``known`` when without them the
    key held no more than its slots (:data:`~.leases.UNRENEWED_CAUSE`); ``evidence``:
    each earlier holder's renewals, in words."""

    key: str
    slots: int
    taken: int
    at: int
    runs: Tuple[str, ...]
    unrenewed: Dict[str, int] = field(default_factory=dict)
    known: bool = False
    evidence: List[str] = field(default_factory=list)
    #: ``at`` in seconds from the history's first event.
    offset_s: float = 0.0

    def told(self) -> str:
        """This overlap in words."""
        cause = f"{UNRENEWED_CAUSE}; " if self.known else ""
        return (f"{self.key}: {self.taken} slots taken at once, of {self.slots} "
                f"(runs {', '.join(self.runs)}): {cause}{self.evidence_told()}")

    def evidence_told(self) -> str:
        """When it began, and each earlier holder's renewals, in words."""
        return f"at +{self.offset_s:.3f} s, " + "; ".join(self.evidence)


@dataclass
class RatePeak:
    """The most admissions of one rate key in any window of one period, against
    rate + burst; ``across_loss``: the most in windows that span a lock store restart
    that lost its data (the limiter's state restarts empty then: documented)."""

    key: str
    allowed: int
    most: int
    across_loss: int = 0

    @property
    def over(self) -> bool:
        return self.most > self.allowed


@dataclass
class Verdict:
    """What the checker found in one history."""

    tasks: int = 0
    bodies: int = 0
    faults: Dict[str, int] = field(default_factory=dict)
    peaks: List[Peak] = field(default_factory=list)
    rates: List[RatePeak] = field(default_factory=list)
    states: Dict[str, int] = field(default_factory=dict)
    #: Tasks without a final state: lost by Celery's own default acks (a worker killed
    #: whole while it ran the body, or after it accepted it), known (see
    #: :func:`classify_lost`), or lost.
    lost_by_celery: List[str] = field(default_factory=list)
    lost_known: List[str] = field(default_factory=list)
    #: Tasks lost in kombu's window between the ``BRPOP`` and ``unacked`` (see
    #: :func:`classify_lost`): the transport's own loss, as without the package.
    lost_in_transport: List[str] = field(default_factory=list)
    lost: List[str] = field(default_factory=list)
    #: Tasks lost (of :attr:`lost`) a delivery of which ended as served by another copy.
    lost_served: List[str] = field(default_factory=list)
    #: Failures other than a killed body's ``WorkerLostError``: task id -> exception.
    failed: Dict[str, str] = field(default_factory=dict)
    #: Bodies beyond a task's first, by why they ran again (one entry per extra body).
    repeated_explained: List[str] = field(default_factory=list)
    repeated_known: List[str] = field(default_factory=list)
    repeated_unexplained: List[str] = field(default_factory=list)
    #: Each known repeat's cause (:data:`AFTER_EMPTY_RESTART`, :data:`KILLED_BEFORE_ACK`).
    known_causes: Dict[str, str] = field(default_factory=dict)
    #: Bodies that never ended, though no fault killed them.
    unended: List[str] = field(default_factory=list)
    lease_lost: int = 0
    #: The lock store kept its data (AOF): then no lease may be lost (docs/reliability.md).
    keeps_data: bool = False
    held: Dict[str, int] = field(default_factory=dict)
    no_ttl: List[str] = field(default_factory=list)
    #: The parking line's leftovers once settled (messages in parking lists, non-zero
    #: counts of a parked line): what -> how many.
    parked: Dict[str, int] = field(default_factory=dict)
    settled: bool = False
    #: Moves of parked messages that moved one (Redis broker), and messages put back in
    #: their parking queue because no worker received their moved copy (each a copy lost
    #: in kombu's window between the ``BRPOP`` and ``unacked``, or taken by a worker that
    #: died before its claim reached the broker).
    moves: int = 0
    restores: int = 0
    #: Tasks of which a copy put back was received again (by its new move id).
    restored_received: List[str] = field(default_factory=list)
    #: Every body that started over its key's slots, whatever the cause.
    overlaps: List[Overlap] = field(default_factory=list)
    #: The workers recorded the renewals (without them no overlap is known).
    renewals_recorded: bool = False
    #: Renewals by outcome (renewed, lost, error).
    renewals: Dict[str, int] = field(default_factory=dict)
    #: ``lease_lost`` signals of a renewal sent after its lease had gone unrenewed for
    #: longer than a lease (:data:`~.leases.UNRENEWED_CAUSE`).
    lease_lost_unrenewed: int = 0
    #: The longest a running body's lease went without a write (start, successful
    #: renewals, end), as a share of its lease: (share, µs, lease µs, run, worker).
    longest_unwritten: Tuple[float, int, int, str, str] = (0.0, 0, 0, "", "")

    def known_overlaps(self) -> List[Overlap]:
        """The overlaps of :data:`~.leases.UNRENEWED_CAUSE`: reported, not defects."""
        return [overlap for overlap in self.overlaps if overlap.known]

    def defects(self) -> List[str]:
        """Every way this history breaks the model; empty when it holds."""
        found = [f"{peak.key}: {peak.most} slots taken at once, of {peak.slots} "
                 f"(runs {', '.join(peak.runs)}){self._first_unknown(peak.key)}"
                 for peak in self.peaks if peak.over and not self.over_known(peak.key)]
        found += [f"{rate.key}: {rate.most} admissions in one period, of {rate.allowed}"
                  for rate in self.rates if rate.over]
        found += [f"lost: task {task} never reached a final state"
                  + (" (a delivery of it ended as served by another copy)"
                     if task in self.lost_served else "") for task in self.lost]
        found += [f"failed: task {task} ({error})" for task, error in self.failed.items()]
        found += [f"ran again, unexplained: {run}" for run in self.repeated_unexplained]
        found += [f"body {run} never ended, and no fault killed it" for run in self.unended]
        lost = self.lease_lost - self.lease_lost_unrenewed
        if self.keeps_data and lost:
            found.append(f"{lost} lease(s) lost though the lock store kept its data")
        found += [f"{key}: {count} slots still held once settled"
                  for key, count in self.held.items() if count]
        found += [f"{key}: lock store key without a time to live" for key in self.no_ttl]
        found += [f"{what}: {count} left once settled"
                  for what, count in self.parked.items() if count]
        if not self.settled:
            found.append("the history has no settle event (the run did not finish)")
        return found

    def _first_unknown(self, key: str) -> str:
        """The first overlap of ``key`` not of the known cause, in words, after "; "."""
        first = next((overlap for overlap in self.overlaps
                      if overlap.key == key and not overlap.known), None)
        return f"; first not known {first.evidence_told()}" if first else ""

    def over_known(self, key: str) -> bool:
        """Whether every overlap of ``key`` is of the known cause."""
        mine = [overlap for overlap in self.overlaps if overlap.key == key]
        return bool(mine) and all(overlap.known for overlap in mine)


def check(events: Iterable[Event]) -> Verdict:
    """Check the history ``events`` against the model (see the module doc)."""
    history = sorted(events, key=lambda event: int(event["t"]))
    sent = {event["task"]: event for event in history if event["kind"] == "sent"}
    faults = [event for event in history if event["kind"] == "fault"]
    bodies = collect_bodies(history, faults)
    verdict = Verdict(tasks=len(sent), bodies=len(bodies))
    for event in faults:
        verdict.faults[event["fault"]] = verdict.faults.get(event["fault"], 0) + 1
    verdict.peaks = slot_peaks(sent, bodies)
    verdict.renewals_recorded = any(event["kind"] == "run" and event.get("renewals")
                                    for event in history)
    renewals = collect_renewals(history)
    verdict.renewals = outcomes(renewals)
    origin = int(history[0]["t"]) if history else 0
    verdict.overlaps = over_slots(sent, bodies)
    for overlap in verdict.overlaps:
        classify_overlap(overlap, sent, bodies, renewals, faults, origin,
                         verdict.renewals_recorded)
    verdict.lease_lost_unrenewed = lost_unrenewed(history, bodies, renewals, faults,
                                                  verdict.renewals_recorded)
    verdict.longest_unwritten = longest_gap(sent, bodies, renewals)
    verdict.rates = rate_peaks(sent, bodies, data_losses(faults), history)
    verdict.unended = [body.run for body in bodies if body.until == OPEN]
    verdict.lease_lost = sum(event["kind"] == "lease_lost" for event in history)
    verdict.keeps_data = any(event["kind"] == "run" and event.get("persistence") == "aof"
                             for event in history)
    check_final(verdict, history, sent, bodies, faults)
    served = {event.get("task") for event in history if event["kind"] == "served"}
    verdict.lost_served = [task for task in verdict.lost if task in served]
    count_moves(verdict, history)
    refusals = [event for event in history if event["kind"] in REFUSALS]
    classify_repeats(verdict, sent, bodies, faults, refusals)
    for event in history:
        if event["kind"] == "settle":
            verdict.settled = True
            verdict.held = {key: int(count) for key, count in event["held"].items()}
            verdict.no_ttl = list(event["no_ttl"])
            verdict.parked = {what: int(n) for what, n in event.get("parked", {}).items()}
    return verdict


def count_moves(verdict: Verdict, history: Sequence[Event]) -> None:
    """The moves, the messages put back, and the tasks whose copy put back was received.

        >>> verdict = Verdict()
        >>> count_moves(verdict, [{"kind": "moved", "what": "moved"},
        ...                       {"kind": "moved", "what": "empty"},
        ...                       {"kind": "restored", "move": "m1r"},
        ...                       {"kind": "received", "task": "t", "move": "m1r"}])
        >>> verdict.moves, verdict.restores, verdict.restored_received
        (1, 1, ['t'])
    """
    verdict.moves = sum(event["kind"] == "moved" and event.get("what") == "moved"
                        for event in history)
    restored = {event.get("move") for event in history if event["kind"] == "restored"}
    verdict.restores = len(restored)
    verdict.restored_received = sorted({
        str(event["task"]) for event in history
        if event["kind"] == "received" and event.get("move") in restored})


def collect_bodies(history: Sequence[Event], faults: Sequence[Event]) -> List[Body]:
    """Every body, from its ``start`` and ``end`` events, each killed body's interval
    closed at the first fault that SIGKILLed its process after it started."""
    bodies: Dict[str, Body] = {}
    for event in history:
        if event["kind"] == "start":
            admitted = event.get("admitted_ms")
            bodies[event["run"]] = Body(
                task=event["task"], run=event["run"], pid=int(event["pid"]),
                worker=str(event.get("worker", "")), start=int(event["t"]),
                admitted_ms=None if admitted in (None, "") else int(admitted),
                redelivered=_flag(event.get("redelivered")), copy=_flag(event.get("copy")),
                token=str(event["token"]) if event.get("token") else None)
        elif event["kind"] == "end" and event["run"] in bodies:
            bodies[event["run"]].end = int(event["t"])
    for body in bodies.values():
        body.killed = kill_time(body, faults)
    return sorted(bodies.values(), key=lambda body: body.start)


def _flag(value: Any) -> Optional[bool]:
    """A recorded true/false, or None when it was not recorded."""
    return None if value in (None, "") else bool(value)


def kill_time(body: Body, faults: Sequence[Event]) -> Optional[int]:
    """When a fault first SIGKILLed ``body``'s process after it started, if one did."""
    for fault in faults:
        if int(fault["t"]) >= body.start and body.pid in set(fault.get("pids") or ()):
            return int(fault["t"])
    return None


def slot_sweeps(sent: Mapping[str, Event], bodies: Sequence[Body]) -> Iterable[
        Tuple[str, int, Iterable[Tuple[float, int, int, Tuple[str, ...]]]]]:
    """Per slot key (sorted), its slots and each start or end of a body holding it, in
    time order: (moment, change of the slots taken, slots taken after, runs holding).
    At one instant an end comes before a start: a slot handed over is not overlap."""
    changes: Dict[str, List[Tuple[float, int, str]]] = defaultdict(list)
    slots: Dict[str, int] = {}
    for body in bodies:
        for limit in sent.get(body.task, {}).get("limits") or ():
            key, cost = limit["key"], int(limit.get("cost", 1))
            slots[key] = int(limit["slots"])
            changes[key].append((body.start, cost, body.run))
            changes[key].append((body.until, -cost, body.run))

    def sweep(key: str) -> Iterable[Tuple[float, int, int, Tuple[str, ...]]]:
        taken = 0
        running: Set[str] = set()
        for moment, change, run in sorted(changes[key], key=lambda c: (c[0], c[1])):
            taken += change
            running.symmetric_difference_update({run})
            yield moment, change, taken, tuple(sorted(running))

    for key in sorted(changes):
        yield key, slots[key], sweep(key)


def slot_peaks(sent: Mapping[str, Event], bodies: Sequence[Body]) -> List[Peak]:
    """Per slot key, the most slots taken by bodies overlapping in time."""
    peaks = []
    for key, slots, sweep in slot_sweeps(sent, bodies):
        peak = Peak(key, slots, 0)
        for moment, _, taken, running in sweep:
            if taken > peak.most:
                peak.most, peak.at, peak.runs = taken, int(moment), running
        peaks.append(peak)
    return peaks


def over_slots(sent: Mapping[str, Event], bodies: Sequence[Body]) -> List[Overlap]:
    """Every start of a body that left its key with more slots taken than it has."""
    return [Overlap(key, slots, taken, int(moment), running)
            for key, slots, sweep in slot_sweeps(sent, bodies)
            for moment, change, taken, running in sweep if change > 0 and taken > slots]


def lease_of(sent: Event, key: str) -> Optional[int]:
    """The lease (µs) of ``key``'s limit of the task ``sent``, if recorded."""
    for limit in sent.get("limits") or ():
        if limit["key"] == key and limit.get("lease_us"):
            return int(limit["lease_us"])
    return None


def classify_overlap(overlap: Overlap, sent: Mapping[str, Event], bodies: Sequence[Body],
                     renewals: Mapping[str, Sequence[Renewal]], faults: Sequence[Event],
                     origin: int, recorded: bool = True) -> None:
    """Find the holders of ``overlap`` whose lease had gone unrenewed for longer than a
    lease when it began (:func:`~.leases.unrenewed_for`): it is ``known``
    (:data:`~.leases.UNRENEWED_CAUSE`) when without them the key held no more than its
    slots, and the renewals were recorded. Each earlier holder's renewals go in its
    ``evidence``."""
    by_run = {body.run: body for body in bodies}
    stalls = stalls_of(faults)
    overlap.offset_s = (overlap.at - origin) / 1e6
    unrenewed_cost = 0
    for run in overlap.runs:
        body = by_run[run]
        if body.start >= overlap.at:
            continue  # the body that started: its lease was just written
        task = sent.get(body.task, {})
        lease = lease_of(task, overlap.key)
        held = renewals.get(body.token or "", ())
        gap = unrenewed_for(body.start, body.token, lease, overlap.at, renewals, stalls)
        written = last_written(body.start, held, overlap.at, stalls)
        overlap.evidence.append(
            f"{run} ({body.worker or '?'}, pid {body.pid}, from "
            f"+{(body.start - origin) / 1e6:.3f} s) lease written last "
            f"{(overlap.at - written) / 1e6:.3f} s before, lease "
            f"{(lease or 0) / 1e6:g} s, {renewals_told(held, overlap.at, origin)}")
        if gap is not None:
            overlap.unrenewed[run] = gap
            unrenewed_cost += next((int(limit.get("cost", 1)) for limit in
                                    task.get("limits") or () if limit["key"] == overlap.key),
                                   1)
    overlap.known = recorded and overlap.taken - unrenewed_cost <= overlap.slots


def longest_gap(sent: Mapping[str, Event], bodies: Sequence[Body],
                renewals: Mapping[str, Sequence[Renewal]]) -> Tuple[float, int, int, str, str]:
    """Of the bodies that ended or were killed, the one whose lease went longest without
    a write as a share of its lease (:func:`~.leases.longest_unwritten`): how near a run
    came to :data:`~.leases.UNRENEWED_CAUSE`."""
    longest: Tuple[float, int, int, str, str] = (0.0, 0, 0, "", "")
    for body in bodies:
        limits = sent.get(body.task, {}).get("limits") or ()
        lease = lease_of(sent.get(body.task, {}), limits[0]["key"]) if limits else None
        if not lease or not body.token or body.until == OPEN:
            continue
        gap, _ = longest_unwritten(body.start, int(body.until), renewals.get(body.token, ()))
        longest = max(longest, (gap / lease, gap, lease, body.run, body.worker))
    return longest


def lost_unrenewed(history: Sequence[Event], bodies: Sequence[Body],
                   renewals: Mapping[str, Sequence[Renewal]], faults: Sequence[Event],
                   recorded: bool = True) -> int:
    """How many ``lease_lost`` signals came from a renewal that found its lease ended
    after it had gone unrenewed for longer than a lease, before that renewal was sent
    (:data:`~.leases.UNRENEWED_CAUSE`): a body still running then, not a defect."""
    if not recorded:
        return 0
    stalls = stalls_of(faults)
    count = 0
    for event in history:
        if event["kind"] != "lease_lost":
            continue
        for body in bodies:
            if body.task != event.get("task") or not body.token:
                continue
            held = renewals.get(body.token, ())
            if any(renewal.outcome == LOST and renewal.pid == int(event.get("pid") or 0)
                   and body.start <= renewal.sent <= int(event["t"])
                   and unrenewed_for(body.start, body.token, renewal.lease_us, renewal.sent,
                                     renewals, stalls) is not None
                   for renewal in held):
                count += 1
                break
    return count


def data_losses(faults: Sequence[Event]) -> List[int]:
    """When the lock store came back without its data (µs)."""
    return [int(fault["t"]) for fault in faults if fault.get("data_lost")]


def rate_peaks(sent: Mapping[str, Event], bodies: Sequence[Body],
               losses: Sequence[int], history: Sequence[Event] = ()) -> List[RatePeak]:
    """Per rate key, the most admissions in any window of one period: the admission
    time is the start the limiter counted (``admitted_ms``, the lock store's clock), or
    the body's start when unknown. Windows spanning a data loss are counted apart: a
    window spans one when it falls after the earliest moment any of its admissions may
    have been counted (:func:`counted_from`) and no later than its last start."""
    admitted: Dict[str, List[Tuple[int, int]]] = defaultdict(list)
    shape: Dict[str, Tuple[int, int]] = {}
    receipts = receipts_of(history)
    for body in bodies:
        rate = sent.get(body.task, {}).get("rate")
        if rate:
            moment = body.start if body.admitted_ms is None else body.admitted_ms * 1000
            admitted[rate["key"]].append((moment, counted_from(body, moment, receipts)))
            shape[rate["key"]] = (int(rate["period_us"]), int(rate["count"]) + int(rate["burst"]))
    peaks = []
    for key in sorted(admitted):
        period, allowed = shape[key]
        moments = sorted(admitted[key])
        within, across = most_in_window([moment for moment, _ in moments], period, losses,
                                        [counted for _, counted in moments])
        peaks.append(RatePeak(key, allowed, within, across))
    return peaks


def receipts_of(history: Sequence[Event]) -> Dict[Tuple[str, str], List[int]]:
    """Per task and worker, when the worker's main process received a delivery of the
    task (µs, in order)."""
    receipts: Dict[Tuple[str, str], List[int]] = defaultdict(list)
    for event in history:
        if event["kind"] == "received":
            receipts[(str(event["task"]), str(event.get("worker", "")))].append(int(event["t"]))
    return receipts


def counted_from(body: Body, moment: int,
                 receipts: Mapping[Tuple[str, str], Sequence[int]]) -> int:
    """The earliest the limiter may have counted ``body``'s admission, whose start was
    ``moment`` (µs): a start is counted when it is admitted or booked, at most
    :data:`BOOK_AHEAD` before it, and asked for only once the worker received the
    delivery the body ran from (its last receipt of the task before the body)."""
    before = [t for t in receipts.get((body.task, body.worker), ()) if t <= body.start]
    return max([moment - BOOK_AHEAD, *before[-1:]])


def most_in_window(moments: Sequence[int], period: int, losses: Sequence[int],
                   counted: Optional[Sequence[int]] = None) -> Tuple[int, int]:
    """The most of ``moments`` (sorted) in any window ``[a, a + period)``: among windows
    that span no moment of ``losses``, and among those that span one. ``counted``: per
    moment, the earliest it may have been counted (else the moment itself); a window
    spans a loss after the earliest of its own and no later than its last moment."""
    counted = moments if counted is None else counted
    within = across = 0
    last = 0
    for first, moment in enumerate(moments):
        last = max(last, first)
        while last + 1 < len(moments) and moments[last + 1] < moment + period:
            last += 1
        count = last - first + 1
        earliest = min(counted[first:last + 1])
        if any(earliest < loss <= moments[last] for loss in losses):
            across = max(across, count)
        else:
            within = max(within, count)
    return within, across


def check_final(verdict: Verdict, history: Sequence[Event], sent: Mapping[str, Event],
                bodies: Sequence[Body], faults: Sequence[Event]) -> None:
    """Fill the final states, the lost tasks (by cause) and the unexpected failures."""
    final = {event["task"]: event for event in history if event["kind"] == "final"}
    receipts = [event for event in history if event["kind"] == "received"]
    accepts = [event for event in history if event["kind"] == "accepted"]
    unacked = {str(task) for event in history if event["kind"] == "settle"
               for task in event.get("unacked_tasks") or ()}
    by_task: Dict[str, List[Body]] = defaultdict(list)
    for body in bodies:
        by_task[body.task].append(body)
    popped = pop_windows(sent, receipts)
    for task, event in sent.items():
        state = final.get(task, {}).get("state", "MISSING")
        verdict.states[state] = verdict.states.get(state, 0) + 1
        if state not in FINAL_STATES:
            cause = classify_lost(event, by_task[task], faults, receipts, accepts, unacked,
                                  popped.get(task))
            {"celery": verdict.lost_by_celery, "known": verdict.lost_known,
             "transport": verdict.lost_in_transport,
             "lost": verdict.lost}[cause].append(task)
        elif state == "FAILURE":
            error = str(final[task].get("error", ""))
            if not (error == WORKER_LOST and any(b.killed for b in by_task[task])):
                verdict.failed[task] = error


def pop_windows(sent: Mapping[str, Event],
                receipts: Sequence[Event]) -> Dict[str, Tuple[int, int]]:
    """For each task no worker received, when its message was taken off the queue, as
    its neighbours in the queue bound it: the workload sends every task to one queue,
    from one thread, in the order of the ``sent`` records, and kombu's Redis transport
    takes the oldest first (moved copies and restored messages go to the other end:
    they never reorder the messages as sent). So the message was taken after the one
    sent just before it that a worker received (at most ``POP_WINDOW[1]`` before that
    one's first receipt) and before the one sent just after it was received. Returned
    with :data:`POP_WINDOW`'s margins, as (from, to) in µs; a task with no received
    neighbour on each side has none (its send bounds it: see :func:`classify_lost`).

        >>> sent = {t: {"task": t, "t": n} for n, t in enumerate("abc", 1)}
        >>> pop_windows(sent, [{"task": "a", "t": 4_000_000}, {"task": "c", "t": 5_000_000}])
        {'b': (2900000, 6000000)}
    """
    first: Dict[str, int] = {}
    for event in receipts:
        task, moment = str(event.get("task")), int(event["t"])
        first[task] = min(moment, first.get(task, moment))
    order = sorted(sent.values(), key=lambda event: int(event["t"]))
    windows: Dict[str, Tuple[int, int]] = {}
    for index, event in enumerate(order):
        if event["task"] in first:
            continue
        before = next((first[e["task"]] for e in reversed(order[:index])
                       if e["task"] in first), None)
        after = next((first[e["task"]] for e in order[index + 1:] if e["task"] in first),
                     None)
        if before is None or after is None:
            continue
        since = max(int(event["t"]), before - POP_WINDOW[1])
        windows[str(event["task"])] = (since + POP_WINDOW[0], after + POP_WINDOW[1])
    return windows


def classify_lost(sent: Event, bodies: Sequence[Body], faults: Sequence[Event],
                  receipts: Sequence[Event] = (), accepts: Sequence[Event] = (),
                  unacked: Iterable[str] = (),
                  popped: Optional[Tuple[int, int]] = None) -> str:
    """Why a task never reached a final state, from its bodies, the deliveries of its
    message that workers received (``receipts``) and accepted (``accepts``), and the
    tasks whose message was still in the broker's ``unacked`` hash once settled:

    ``celery``  Celery's own default acks: its body was killed with its whole worker, or
                the worker that last received it accepted it (Celery acknowledges a
                default-acks run when a pool process accepts it) and was killed whole
                before a body of it started
    ``known``   the worker that last received it was killed whole after receiving it and
                before a body of it started, and its message was still in the broker's
                ``unacked`` hash once settled: kombu's Redis transport keeps a delivered
                message there (``QoS.append``: ``unacked_index`` scored by the delivery
                time) until it is acknowledged, or until a live worker's
                ``restore_visible`` puts it back in its queue; that sweep restores only
                entries older than ``visibility_timeout``, and runs on a timer in a
                worker with an event loop (prefork), but in a worker without one (gevent,
                eventlet) only after a poll that found nothing to read
    ``transport`` no delivery of it was ever received, no body of it started, and a
                worker was killed whole while its message may have been taken off the
                queue: between the moments its neighbours in the queue bound
                (``popped``, see :func:`pop_windows`), or without them within
                :data:`POP_WINDOW` of its send (an idle worker's ``BRPOP`` is served at
                the publish): a message taken off its queue by that worker's
                ``BRPOP`` and lost before ``QoS.append`` wrote it to ``unacked`` (only
                in the killed process's socket or memory then). Celery alone loses it
                too. (For a copy the package sent, whose publish is not recorded, the
                history cannot show this window: such a loss is ``lost``.)
    ``lost``    anything else (a defect)
    """
    task = sent["task"]
    if not sent.get("acks_late") and any(body.killed for body in bodies):
        return "celery"
    mine = [event for event in receipts if event.get("task") == task]
    if not mine:
        since = int(sent["t"])
        start, end = popped or (since + POP_WINDOW[0], since + POP_WINDOW[1])
        killed = any(fault.get("worker") and start <= int(fault["t"]) <= end
                     for fault in faults)
        return "transport" if killed and not bodies else "lost"
    last = max(mine, key=lambda event: int(event["t"]))
    received = int(last["t"])
    kill = next((int(fault["t"]) for fault in faults
                 if fault.get("worker") and int(fault["t"]) > received
                 and last.get("pid") in set(fault.get("pids") or ())), None)
    if kill is None or any(body.start > received for body in bodies):
        return "lost"
    if not sent.get("acks_late") and any(
            event.get("task") == task and event.get("pid") == last.get("pid")
            and received <= int(event["t"]) <= kill for event in accepts):
        return "celery"
    return "known" if task in set(unacked) else "lost"


def classify_repeats(verdict: Verdict, sent: Mapping[str, Event], bodies: Sequence[Body],
                     faults: Sequence[Event], refusals: Sequence[Event] = ()) -> None:
    """Each body beyond a task's first, by why it ran again (see :func:`why_again`)."""
    by_task: Dict[str, List[Body]] = defaultdict(list)
    for body in bodies:
        by_task[body.task].append(body)
    refused: Dict[str, List[Event]] = defaultdict(list)
    for event in refusals:
        refused[str(event.get("task"))].append(event)
    for task, runs in by_task.items():
        for index in range(1, len(runs)):
            why = why_again(sent.get(task, {}), runs[:index], runs[index], faults,
                            refused[task])
            run = runs[index].run
            if why in (AFTER_EMPTY_RESTART, KILLED_BEFORE_ACK):
                verdict.repeated_known.append(run)
                verdict.known_causes[run] = why
            else:
                {"explained": verdict.repeated_explained,
                 "unexplained": verdict.repeated_unexplained}[why].append(run)


def why_again(sent: Event, earlier: Sequence[Body], again: Body,
              faults: Sequence[Event], refusals: Sequence[Event] = ()) -> str:
    """Why ``again`` ran after the ``earlier`` bodies of its task:

    ``explained``    the task acks late and a fault killed an earlier body's process, or
                     its whole worker, after that body started and before this one did:
                     Celery redelivers it (``reject_on_worker_lost``), as without the package
    :data:`AFTER_EMPTY_RESTART`  known: the lock store came back without its data after
                     the task was sent and before this body started: docs/reliability.md
                     says waiting runs may run again then (issue "one copy of every run")
    :data:`KILLED_BEFORE_ACK`  known, how runs wait (issue "one copy of every run"): see
                     :func:`killed_before_ack`
    ``unexplained``  anything else: a defect
    """
    if sent.get("acks_late"):
        for body in earlier:
            for fault in faults:
                moment = int(fault["t"])
                if not body.start <= moment < again.start:
                    continue
                if body.pid in set(fault.get("pids") or ()) or (
                        fault.get("worker") and fault.get("worker") == body.worker):
                    return "explained"
    since = int(sent.get("t", 0))
    if any(since < loss < again.start for loss in data_losses(faults)):
        return AFTER_EMPTY_RESTART
    if killed_before_ack(sent, again, faults, refusals):
        return KILLED_BEFORE_ACK
    return "unexplained"


def killed_before_ack(sent: Event, again: Body, faults: Sequence[Event],
                      refusals: Sequence[Event]) -> bool:
    """Whether ``again`` ran from a message delivered a second time because the worker
    that refused it was killed whole before acknowledging it: a refused run is sent back
    to wait as a copy, published before the refused message is acknowledged (under
    either ack mode: the message never reached the pool), so both run. The history
    proves it only with all of these (a body killed under ``acks_late`` is explained
    before this is looked at):

    * ``again`` started from a message the broker redelivered (never acknowledged);
    * a refusal record of that message, written by a process that a whole-worker kill
      killed at most :data:`ACK_WINDOW` later (the acknowledgement follows the record at
      once), before ``again`` started. For the message the task was sent as (no copy of
      the package's), that is the task's first refusal record (copies exist only once
      it was refused); for a copy, a refusal of the task by that worker in that window
      (the copy it held unacknowledged when killed).
    """
    if again.redelivered is not True or again.copy is None:
        return False
    if not refusals:
        return False
    if again.copy:
        candidates = list(refusals)
    else:
        candidates = [min(refusals, key=lambda event: int(event["t"]))]
    return any(
        fault.get("worker") and refusal.get("pid") in set(fault.get("pids") or ())
        and int(refusal["t"]) <= int(fault["t"]) <= int(refusal["t"]) + ACK_WINDOW
        and int(fault["t"]) < again.start
        for refusal in candidates for fault in faults)
