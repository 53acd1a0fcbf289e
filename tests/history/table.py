"""One table per run: what was injected, what the checker found, and the verdict."""

from __future__ import annotations

from typing import List, Mapping

from .checker import AFTER_EMPTY_RESTART, KILLED_BEFORE_ACK, KNOWN_CAUSE, LOST_KNOWN_CAUSE, Verdict
from .leases import ERROR, LOST, RENEWED, UNRENEWED_CAUSE


def render(title: str, verdict: Verdict, facts: Mapping[str, object]) -> str:
    """The table of one run: ``title``, ``facts`` about the run (seed, mode...), then the
    checker's figures, the per-key peaks, and every defect (or ``PASS``)."""
    faults = ", ".join(f"{kind} {count}" for kind, count in sorted(verdict.faults.items()))
    rows = [(name, str(value)) for name, value in facts.items()]
    rows += [
        ("tasks sent", str(verdict.tasks)),
        ("bodies run", str(verdict.bodies)),
        ("faults injected", faults or "none"),
        ("final states", ", ".join(f"{s} {n}" for s, n in sorted(verdict.states.items()))),
        ("limit violations", str(sum(p.over for p in verdict.peaks)
                                 + sum(r.over for r in verdict.rates))),
        ("slots over the limit, known cause", f"{len(verdict.known_overlaps())} body "
                                              f"start(s) ({UNRENEWED_CAUSE})"),
        ("runs lost", str(len(verdict.lost))),
        ("runs lost, known cause", f"{len(verdict.lost_known)} ({LOST_KNOWN_CAUSE})"),
        ("runs lost by Celery's default acks", str(len(verdict.lost_by_celery))),
        ("runs lost by kombu (BRPOP, then killed)", str(len(verdict.lost_in_transport))),
        ("unexpected failures", str(len(verdict.failed))),
        ("repeated bodies, explained", f"{len(verdict.repeated_explained)} "
                                       "(a killed body, acks_late)"),
        ("repeated bodies, known", f"{len(verdict.repeated_known)} ({KNOWN_CAUSE}: "
                                   f"{_known(verdict, AFTER_EMPTY_RESTART)} after "
                                   f"{AFTER_EMPTY_RESTART}, "
                                   f"{_known(verdict, KILLED_BEFORE_ACK)} {KILLED_BEFORE_ACK})"),
        ("repeated bodies, unexplained", str(len(verdict.repeated_unexplained))),
        ("lease_lost signals", f"{verdict.lease_lost} ({verdict.lease_lost_unrenewed} "
                               "after a lease unrenewed)"),
        ("renewals: renewed / lost / error",
         " / ".join(str(verdict.renewals.get(outcome, 0)) for outcome in (RENEWED, LOST, ERROR))
         + ("" if verdict.renewals_recorded else " (not recorded)")),
        ("longest a lease went unwritten", _longest(verdict)),
        ("slots held once settled", str(sum(verdict.held.values()))),
        ("keys without a TTL", str(len(verdict.no_ttl))),
        ("parking leftovers", str(sum(verdict.parked.values()))),
        ("moves; put back (received after)", f"{verdict.moves}; {verdict.restores} "
                                             f"({len(verdict.restored_received)})"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"== {title} ==", *(f"  {name:<{width}}  {value}" for name, value in rows)]
    lines.append("  per key, most taken at once / limit:")
    lines += _peak_lines(verdict)
    known = verdict.known_overlaps()
    if known:
        lines.append(f"  over the limit, known cause (not a defect of the package): "
                     f"{len(known)}")
        lines += [f"    - {overlap.told()}" for overlap in known]
    defects = verdict.defects()
    lines.append("  verdict: " + ("PASS" if not defects else f"{len(defects)} DEFECT(S)"))
    lines += [f"    - {defect}" for defect in defects]
    return "\n".join(lines)


def _longest(verdict: Verdict) -> str:
    share, gap, lease, run, worker = verdict.longest_unwritten
    if not run:
        return "-"
    return f"{gap / 1e6:.3f} s of a {lease / 1e6:g} s lease ({share:.2f}; {run}, {worker})"


def _known(verdict: Verdict, cause: str) -> int:
    return sum(why == cause for why in verdict.known_causes.values())


def _peak_lines(verdict: Verdict) -> List[str]:
    cells = [f"{peak.key} {peak.most}/{peak.slots}{' OVER' if peak.over else ''}"
             f"{' (known cause)' if peak.over and verdict.over_known(peak.key) else ''}"
             for peak in verdict.peaks]
    cells += [f"{rate.key} {rate.most}/{rate.allowed} per period"
              f"{' OVER' if rate.over else ''}"
              f"{f' (across a data loss: {rate.across_loss})' if rate.across_loss else ''}"
              for rate in verdict.rates]
    return [f"    {'; '.join(cells[i:i + 5])}" for i in range(0, len(cells), 5)]
