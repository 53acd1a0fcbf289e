"""``celery redislock watch``: a live view of every key, its holders and its parked line.

Plain text, redrawn in place with two ANSI codes on a terminal; on anything else (a
pipe, a file, a CI log) each refresh is printed after the last, without escape codes.

    >>> from celery_redislock.admin.state import LimitState
    >>> print("\\n".join(render([LimitState("crawl", "k", 0, exists=True,
    ...                                      configured_slots=2)], rows=3)[1:]))
    NAME   USED  WAITING  PAUSED  OVERRIDE  RATE
    crawl  0/2   0        no      -         -
"""

from __future__ import annotations

import datetime
import shutil
import sys
import time
from typing import Any, Callable, List, Optional, Sequence

from .parked_text import parked_cell, parked_summary, reservation_for
from .rules import Rules, rate_column, used_text
from .state import LimitState, pause_short, pause_text
from .table import ELLIPSIS, terminal_width, text_table

#: Clear the screen and put the cursor top left.
CLEAR = "\x1b[H\x1b[2J"


def render(states: Sequence[LimitState], *, rows: int = 5,
           interval: Optional[float] = None, rules: Optional[Rules] = None,
           width: Optional[int] = None) -> List[str]:
    """The lines of one view: a title, then per key a summary line followed by up to
    ``rows`` holders and ``rows`` reservations, indented; with ``width``, each line cut to it
    (names first)."""
    now = states[0].server_time_ms if states else None
    title = "celery-redislock: " + (f"{len(states)} key(s)" if states else "no keys")
    if now is not None:
        title += f" at {_iso(now)} (Redis server time)"
    if interval is not None:
        title += f", every {interval:g}s, Ctrl-C to quit"
    lines = [title]
    if not states:
        return lines
    header = ["NAME", "USED", "WAITING", "PAUSED", "OVERRIDE", "RATE"]
    table = text_table(header, [[
        state.name,
        used_text(state),
        str(state.waiting),
        pause_text(state) if width is None else pause_short(state),
        "-" if state.slots_override is None else str(state.slots_override),
        rate_column(state, rules),
    ] for state in states], width=width, shrink=[0])
    lines.append(table[0])
    for row, state in zip(table[1:], states):
        lines.append(row)
        lines.extend(line if width is None or len(line) <= width
                     else line[:width - 1] + ELLIPSIS for line in _details(state, rows))
    return lines


def _details(state: LimitState, rows: int) -> List[str]:
    now = state.server_time_ms
    lines: List[str] = []
    live = state.live_holders
    for holder in live[:rows]:
        lines.append(f"    holds   {holder.task or '-'} {holder.task_id or holder.token} "
                     f"on {holder.worker or '-'}, {holder.age(now):.1f}s, "
                     f"lease {holder.lease_left(now):.1f}s"
                     + ("" if holder.args is None else f", args {holder.args}"))
    if len(live) > rows:
        lines.append(f"    ... {len(live) - rows} more holder(s)")
    for reservation in state.reservations[:rows]:
        lines.append(f"    kept    for {reservation_for(reservation.ticket)}, "
                     f"{(reservation.until_ms - now) / 1000:.1f}s")
    if state.parked is not None:
        lines.append(f"    parked  {parked_summary(state.parked)}; in the broker: "
                     f"{parked_cell(state)}")
    return lines


def _iso(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _fit(lines: List[str], height: int) -> List[str]:
    """At most ``height`` lines, the last saying how many were left out."""
    if len(lines) <= height:
        return lines
    keep = max(1, height - 1)
    return [*lines[:keep], f"... {len(lines) - keep} more line(s): make the window taller"]


def run_watch(snapshot: Callable[[], Sequence[LimitState]], *, interval: float = 1.0,
              once: bool = False, rows: int = 5, stream: Any = None,
              is_tty: Optional[bool] = None, rules: Optional[Rules] = None,
              wide: bool = False) -> None:
    """Print a view of ``snapshot()`` every ``interval`` seconds until Ctrl-C (or once).

    ``stream`` defaults to standard output; on a terminal each view replaces the last.
    Lines are cut to the terminal's width unless ``wide``.
    """
    stream = stream if stream is not None else sys.stdout
    tty = is_tty if is_tty is not None else bool(getattr(stream, "isatty", lambda: False)())
    first = True
    try:
        while True:
            lines = render(snapshot(), rows=rows, interval=None if once else interval,
                           rules=rules, width=None if wide else terminal_width())
            if tty:
                size = shutil.get_terminal_size()
                _write(stream, CLEAR + "\n".join(_fit(lines, size.lines - 1)))
            else:
                _write(stream, ("" if first else "\n") + "\n".join(lines))
            first = False
            if once:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        _write(stream, "")


def _write(stream: Any, text: str) -> None:
    stream.write(text + "\n")
    if hasattr(stream, "flush"):
        stream.flush()
