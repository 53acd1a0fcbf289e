"""Small helpers shared by the benchmarks: server command counts, tables, result files."""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Sequence

import redis

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Commands the benchmark harness itself sends to read the counters; left out of counts.
HARNESS_COMMANDS = frozenset({"info", "config|resetstat"})


def command_calls(client: redis.Redis) -> Dict[str, int]:
    """``INFO commandstats`` as ``{command: calls}``; Lua scripts' inner commands included."""
    return {name: int(values["calls"]) for name, values in _commandstats(client).items()}


def command_usec(client: redis.Redis) -> Dict[str, int]:
    """``INFO commandstats`` as ``{command: total microseconds spent in it by the server}``.

    A script's own entry (``evalsha``) covers its whole run, inner commands included.
    """
    return {name: int(values["usec"]) for name, values in _commandstats(client).items()}


def _commandstats(client: redis.Redis) -> Dict[str, Dict[str, Any]]:
    stats = client.info("commandstats")
    return {
        name[len("cmdstat_"):]: values
        for name, values in stats.items()
        if name.startswith("cmdstat_")
    }


def commands_processed(client: redis.Redis) -> int:
    """``INFO stats`` ``total_commands_processed``."""
    return int(client.info("stats")["total_commands_processed"])


def calls_delta(
    before: Mapping[str, int], after: Mapping[str, int], ignore: Iterable[str] = ()
) -> Dict[str, int]:
    """Per-command call counts made between two :func:`command_calls` snapshots."""
    skipped = set(HARNESS_COMMANDS) | set(ignore)
    delta = {
        name: calls - before.get(name, 0)
        for name, calls in after.items()
        if name not in skipped
    }
    return {name: calls for name, calls in sorted(delta.items()) if calls > 0}


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    return float(statistics.median(values))


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; floats are shown with sensible precision."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines.extend("| " + " | ".join(cell(value) for value in row) + " |" for row in rows)
    return "\n".join(lines)


def environment(client: redis.Redis) -> Dict[str, Any]:
    """Versions and machine facts worth keeping beside the numbers."""
    import celery
    import kombu

    import celery_redislock

    server = client.info("server")
    return {
        "celery_redislock": celery_redislock.__version__,
        "package_commit": _package_commit(),
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis_server": server.get("redis_version"),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpus": _cpu_count(),
    }


def _package_commit() -> str:
    """The commit the package's checkout is at (uncommitted edits are not shown), or ''.

    ``REDISLOCK_BENCH_COMMIT`` overrides it, for a run from an exported copy of a commit.
    """
    import os
    import subprocess

    if os.environ.get("REDISLOCK_BENCH_COMMIT"):
        return os.environ["REDISLOCK_BENCH_COMMIT"]

    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 1


def write_json(filename: str, data: Mapping[str, Any]) -> Path:
    """Write ``data`` to ``benchmarks/results/<filename>`` and return the path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / filename
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def server_counters(client: redis.Redis) -> Dict[str, Any]:
    """One ``INFO everything``: ``calls`` per command (as :func:`command_calls`), ``reads``
    (``total_reads_processed``: requests read from clients' sockets, about one per round
    trip; this call's own read included) and ``cpu`` (the server's CPU seconds)."""
    info = client.info("everything")
    return {
        "calls": {name[len("cmdstat_"):]: int(values["calls"])
                  for name, values in info.items() if name.startswith("cmdstat_")},
        "reads": int(info["total_reads_processed"]),
        "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
    }
