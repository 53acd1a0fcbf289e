"""The timeline chart of a burst: per limit key, how many runs were inside their bodies over
time (a step line), with the limit drawn; for a rate limit, the runs started so far against
the most the rate allows.

    draw_timeline(report, Path("docs/images/demo_timeline.png"), subtitle="3 workers x 3")

Drawn from the tasks' records (start and end times on the Redis server's clock), with
matplotlib's Agg backend, so it needs no display.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

from proj.summary import KeyReport, Report

COLOURS = {"crawl": "#3b6fb6", "customer": "#e07b39", "rebuild": "#3a9a5b",
           "partner": "#8a5ab8"}
LIMIT_COLOUR = "#c0392b"


def colour_of(name: str) -> str:
    """One colour per kind of key."""
    return next((colour for word, colour in COLOURS.items() if word in name), "#555555")


def concurrency_steps(intervals: Sequence[Tuple[float, float]], end: float
                      ) -> Tuple[List[float], List[int]]:
    """``(times, levels)`` of a step function: how many intervals are open from each time on."""
    events = sorted([(start, 1) for start, _ in intervals] + [(stop, -1) for _, stop in intervals])
    times, levels, level = [0.0], [0], 0
    for time, change in events:
        level += change
        times.append(time)
        levels.append(level)
    times.append(end)
    levels.append(level)
    return times, levels


def cumulative_steps(times: Sequence[float], end: float) -> Tuple[List[float], List[int]]:
    """``(times, counts)`` of how many of ``times`` have passed, from 0 to ``end``."""
    ordered = sorted(times)
    return [0.0, *ordered, end], [0, *range(1, len(ordered) + 1), len(ordered)]


def _slot_panel(axis, key: KeyReport, origin_us: int, end: float) -> None:
    colour = colour_of(key.limit.name)
    intervals = [((run.start_us - origin_us) / 1e6, (run.end_us - origin_us) / 1e6)
                 for run in key.runs if run.end_us is not None]
    times, levels = concurrency_steps(intervals, end)
    slots = key.limit.slots or 1
    axis.fill_between(times, levels, step="post", color=colour, alpha=0.25, linewidth=0)
    axis.step(times, levels, where="post", color=colour, linewidth=1.6)
    axis.axhline(slots, color=LIMIT_COLOUR, linestyle="--", linewidth=1.2)
    axis.set_ylim(0, slots + 0.7)
    axis.set_yticks(range(slots + 1))
    axis.text(1.005, slots, f"limit {slots}", transform=axis.get_yaxis_transform(),
              color=LIMIT_COLOUR, va="center", fontsize=8.5)
    _caption(axis, key, f"running (peak {key.peak}/{slots})")


def _rate_panel(axis, key: KeyReport, origin_us: int, end: float) -> None:
    colour = colour_of(key.limit.name)
    rate = key.limit.rate
    assert rate is not None
    starts = [run.admitted_ms * 1000 for run in key.runs if run.admitted_ms is not None]
    times, counts = cumulative_steps([(start - origin_us) / 1e6 for start in starts], end)
    axis.step(times, counts, where="post", color=colour, linewidth=1.6)
    axis.fill_between(times, counts, step="post", color=colour, alpha=0.15, linewidth=0)
    top = key.limit.sent + 1
    if starts:
        # The most starts the rate allows since the first: burst + 1 at once, then one per
        # interval; drawn until it leaves the panel.
        first = (min(starts) - origin_us) / 1e6
        at_first = rate.burst + 1
        leaves = first + (top - at_first) * rate.period / rate.count
        last = min(end, leaves)
        allowed = at_first + (last - first) * rate.count / rate.period
        axis.plot([first, last], [at_first, allowed], color=LIMIT_COLOUR, linestyle="--",
                  linewidth=1.2)
        axis.text(0.995, 0.05, f"dashed: the most starts allowed ({key.limit.label}, "
                  f"burst {rate.burst})", transform=axis.transAxes, color=LIMIT_COLOUR,
                  ha="right", va="bottom", fontsize=8.5)
    axis.set_ylim(0, key.limit.sent * 1.3 + 1)
    _caption(axis, key, f"runs started so far (most in one period: {key.most_starts}/"
                        f"{key.limit.most_starts})")


def _caption(axis, key: KeyReport, what: str) -> None:
    axis.text(0.005, 0.93, f"{key.limit.name}", transform=axis.transAxes, va="top",
              fontsize=9.5, fontweight="bold")
    axis.text(0.995, 0.93, f"{what} · {key.completed}/{key.limit.sent} done",
              transform=axis.transAxes, va="top", ha="right", fontsize=8.5, color="#444444")


def draw_timeline(report: Report, path: Path, subtitle: str = "") -> Path:
    """Write the chart of ``report`` to ``path`` (PNG); return ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = report.sent_at_us
    end = max([(run.end_us - origin) / 1e6 for key in report.keys for run in key.runs
               if run.end_us is not None] or [1.0]) + 0.2
    ratios = [2.0 if key.limit.slots is None else 0.55 + 0.3 * key.limit.slots
              for key in report.keys]
    height = 1.15 * sum(ratios) + 1.3  # inches: the panels, then titles and axis label
    figure, axes = plt.subplots(len(report.keys), 1, sharex=True, figsize=(10, height),
                                gridspec_kw={"height_ratios": ratios, "hspace": 0.18})
    for axis, key in zip(axes, report.keys):
        if key.limit.rate is not None and key.limit.slots is None:
            _rate_panel(axis, key, origin, end)
        else:
            _slot_panel(axis, key, origin, end)
        axis.set_xlim(0, end)
        axis.grid(axis="x", color="#dddddd", linewidth=0.6)
        for side in ("top", "right"):
            axis.spines[side].set_visible(False)
        axis.tick_params(labelsize=8.5)
    axes[-1].set_xlabel("seconds since the burst was sent")
    title = "celery-redislock demo: runs of each limit key over time (dashed: the limit)"
    figure.suptitle(title, fontsize=12, x=0.5, y=1 - 0.12 / height)
    if subtitle:
        figure.text(0.5, 1 - 0.5 / height, subtitle, ha="center", fontsize=9, color="#555555")
    figure.subplots_adjust(left=0.05, right=0.92, top=1 - 0.8 / height, bottom=0.55 / height)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
