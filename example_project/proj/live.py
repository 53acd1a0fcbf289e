"""A live view of a burst, in the terminal: per limit key, its slots, waiting and done runs.

Slots in use come from the lock store itself: the live members of each semaphore (score
above the server's time in ms; negative scores are statistics, members starting with
``~`` are slots reserved for a run moved out of parking, "handed over"), and how many
runs its parked line counts (the lock store keeps counts; the runs wait in the broker). Waiting and
done runs come from the tasks' own records (:mod:`proj.records`). Rate limits show the
starts within the last period against the most allowed.

On a terminal the view is redrawn in place several times a second; otherwise (a pipe, a
CI log) it prints one line a second.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from celery_redislock.engine.keys import companion_key
from celery_redislock.engine.parked_view import COUNTS
from proj.burst import Limit
from proj.records import Progress, Recorder

HELD, HANDED_OVER, FREE = "█", "▒", "·"
COLOURS = {HELD: "\x1b[32m", HANDED_OVER: "\x1b[33m", FREE: "\x1b[2m"}  # green, yellow, dim
RESET, BOLD = "\x1b[0m", "\x1b[1m"
REFRESH_TTY = 0.2
REFRESH_PLAIN = 1.0
NAME_WIDTH = 26
MOST_CELLS = 12


def parked_counts_key(semaphore: str) -> str:
    """The key of the counts of the parked line of the semaphore ``semaphore``."""
    return companion_key(semaphore, COUNTS)


@dataclass(frozen=True)
class SlotState:
    """A semaphore as the lock store holds it at one moment."""

    held: int  # live holders
    handed_over: int  # slots reserved for runs moved out of parking
    in_line: int  # runs its parked line counts


def read_semaphores(client: Any, semaphores: Sequence[str]) -> Dict[str, SlotState]:
    """Read every semaphore (and its parked line's counts) in one round trip, on the
    server's clock."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for key in semaphores:
        pipe.zrangebyscore(key, 0, "+inf", withscores=True)
        pipe.hmget(parked_counts_key(key), ["w", "a"])
    replies = pipe.execute()
    seconds, micros = replies[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    states = {}
    for n, key in enumerate(semaphores):
        members, counts = replies[1 + 2 * n], replies[2 + 2 * n]
        in_line = sum(int(count or 0) for count in counts)
        live = [member for member, score in members if score > now_ms]
        reserved = sum(1 for member in live if member.startswith(b"~"))
        states[key] = SlotState(len(live) - reserved, reserved, int(in_line))
    return states


@dataclass(frozen=True)
class Row:
    """What one line of the view shows for one limit key."""

    limit: Limit
    used: int  # slots held or handed over; for a rate limit, starts in the last period
    handed_over: int
    capacity: int  # slots; for a rate limit, the most starts allowed in a period
    waiting: int  # sent, not started yet
    in_line: Optional[int]  # in its parked line (None: no such line)
    done: int


def rows(limits: Sequence[Limit], progress: Dict[str, Progress],
         slots: Dict[str, SlotState], recent_starts: Dict[str, int]) -> List[Row]:
    """Combine the lock store's state and the tasks' records into one row per limit key."""
    result = []
    for limit in limits:
        runs = progress[limit.name]
        waiting = limit.sent - runs.started
        if limit.semaphore is not None:
            state = slots[limit.semaphore]
            result.append(Row(limit, used=state.held + state.handed_over,
                              handed_over=state.handed_over, capacity=limit.slots or 0,
                              waiting=waiting, in_line=state.in_line, done=runs.ended))
        else:
            result.append(Row(limit, used=recent_starts.get(limit.name, 0), handed_over=0,
                              capacity=limit.most_starts or 0, waiting=waiting, in_line=None,
                              done=runs.ended))
    return result


def cells(row: Row) -> List[str]:
    """The slots of ``row``: held, handed over, then free (at most :data:`MOST_CELLS`, one
    cell standing for several slots beyond that)."""
    scale = max(1.0, row.capacity / MOST_CELLS)
    held = round(max(0, row.used - row.handed_over) / scale)
    handed = round(row.handed_over / scale)
    total = round(row.capacity / scale)
    return [HELD] * held + [HANDED_OVER] * handed + [FREE] * max(0, total - held - handed)


def bar(row: Row, width: int, colour: bool = False) -> str:
    """The cells of ``row``, two characters each, padded to ``width`` characters."""
    drawn = [cell * 2 for cell in cells(row)]
    pad = " " * max(0, width - len(" ".join(drawn)))
    if colour:
        drawn = [f"{COLOURS[text[0]]}{text}{RESET}" for text in drawn]
    return " ".join(drawn) + pad


def render(elapsed: float, table: Sequence[Row], show_line: bool,
           colour: bool = False) -> List[str]:
    """The lines of the view on a terminal."""
    width = max(len(bar(row, 0)) for row in table)
    line_head = "  in line" if show_line else ""
    bold, reset = (BOLD, RESET) if colour else ("", "")
    lines = [f"{bold}  {elapsed:5.1f} s   {'limit key':<{NAME_WIDTH}} {'limit':>7}  "
             f"{'in use':<{width + 6}} waiting{line_head}   done{reset}"]
    for row in table:
        in_line = f"  {row.in_line:7d}" if show_line and row.in_line is not None else (
            "  " + " " * 7 if show_line else "")
        lines.append(
            f"            {row.limit.name:<{NAME_WIDTH}} {row.limit.label:>7}  "
            f"{bar(row, width, colour)} {row.used:>2}/{row.capacity:<2} {row.waiting:7d}"
            f"{in_line}  {row.done:>3}/{row.limit.sent:<3}"
        )
    legend = [(HELD, "slot held"), (HANDED_OVER, "handed over to the next waiter"),
              (FREE, "free")]
    lines.append("            " + "   ".join(
        f"{COLOURS[cell] if colour else ''}{cell * 2}{reset} {text}" for cell, text in legend
    ) + "   (a rate: starts in the last period)")
    return lines


def render_plain(elapsed: float, table: Sequence[Row], show_line: bool = False) -> str:
    """One line for a log: ``key used/capacity w<waiting> d<done>`` per key (and
    ``l<in line>`` once a parked line formed)."""
    parts = [
        f"{row.limit.name} {row.used}/{row.capacity} w{row.waiting}"
        + (f" l{row.in_line}" if show_line and row.in_line is not None else "")
        + f" d{row.done}"
        for row in table
    ]
    return f"  {elapsed:5.1f} s  " + " | ".join(parts)


#: Printed once, before the first of :func:`render_plain`'s lines, so that a log read
#: later says what ``w14 l14 d0`` means where it is.
PLAIN_LEGEND = ("  one line a second, per limit key: in use/limit (for a rate: starts in the "
                "last period/most it allows), w = sent, not started yet, l = in its parked "
                "line (once one formed), d = done")


class LiveView:
    """Watches a burst until it is over, drawing :func:`render` (or :func:`render_plain`).

    Example::

        view = LiveView(records, lock_client, limits)
        view.watch(until=lambda: everything_done(), timeout=30)
    """

    def __init__(self, records: Recorder, lock_client: Any, limits: Sequence[Limit],
                 out: TextIO = sys.stdout, tty: Optional[bool] = None) -> None:
        self.records = records
        self.lock_client = lock_client
        self.limits = list(limits)
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.semaphores = [limit.semaphore for limit in self.limits if limit.semaphore]
        self.rated = [limit for limit in self.limits if limit.rate is not None]
        self.saw_waiting_line = False
        self._drawn = 0

    def snapshot(self) -> List[Row]:
        """Read the lock store and the records once."""
        slots = read_semaphores(self.lock_client, self.semaphores)
        progress = self.records.progress([limit.name for limit in self.limits])
        recent = {
            limit.name: self.records.recent_starts(limit.name, limit.rate.period)
            for limit in self.rated if limit.rate is not None
        }
        self.saw_waiting_line |= any(state.in_line for state in slots.values())
        return rows(self.limits, progress, slots, recent)

    def watch(self, until: Callable[[List[Row]], bool], timeout: float) -> bool:
        """Redraw until ``until(rows)`` is true (then return True) or ``timeout`` passes."""
        begun = time.monotonic()
        refresh = REFRESH_TTY if self.tty else REFRESH_PLAIN
        if self.tty:
            self.out.write("\x1b[?25l")  # hide the cursor while redrawing
        try:
            while True:
                table = self.snapshot()
                finished = until(table)
                self.draw(time.monotonic() - begun, table)
                if finished:
                    return True
                if time.monotonic() - begun > timeout:
                    return False
                time.sleep(refresh)
        finally:
            if self.tty:
                self.out.write("\x1b[?25h")
                self.out.flush()

    def draw(self, elapsed: float, table: Sequence[Row]) -> None:
        """Print the view: over the previous one on a terminal, as a new line otherwise."""
        if not self.tty:
            if not self._drawn:
                print(PLAIN_LEGEND, file=self.out)
                self._drawn = 1
            print(render_plain(elapsed, table, self.saw_waiting_line), file=self.out,
                  flush=True)
            return
        lines = render(elapsed, table, self.saw_waiting_line, colour=True)
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.out.flush()
        self._drawn = len(lines)
