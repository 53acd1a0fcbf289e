"""Acquire+release cycles per second: ``Semaphore`` versus redis-py's ``Lock``, and PING.

One private redis-server, one client, one connection, no contention (``slots=1``, nobody
else holds the key). Each kind runs ``--cycles`` cycles per round; rounds are interleaved
(the order rotates each round) and the median round is reported. Server commands per
cycle come from ``INFO commandstats`` deltas (a Lua script's inner commands count there),
client round trips per cycle from counting the commands the client sends.

Run from the repository root::

    python -m benchmarks.bench_semaphore --cycles 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import redis

from celery_redislock import Semaphore
from celery_redislock.testing import RedisServer

from .common import (
    calls_delta,
    command_calls,
    command_usec,
    commands_processed,
    environment,
    markdown_table,
    median,
    write_json,
)

Cycle = Callable[[], None]

SEMAPHORE = "Semaphore"
LOCK = "redis-py Lock"
PING = "PING (1 round trip)"
KINDS = (SEMAPHORE, LOCK, PING)


class CountingRedis(redis.Redis):
    """A redis-py client that counts the commands it sends (each one is a round trip)."""

    round_trips: int = 0
    sent: Set[str] = set()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Count (and remember the command's name), then send the command as usual."""
        self.round_trips += 1
        self.sent = self.sent | {str(args[0]).lower()}
        return super().execute_command(*args, **options)


def semaphore_cycle(client: redis.Redis) -> Cycle:
    """One uncontended acquire+release of a one-slot ``Semaphore``."""
    semaphore = Semaphore(client, "bench:semaphore", slots=1, lease=30)

    def cycle() -> None:
        lease = semaphore.acquire()
        if lease is None:
            raise RuntimeError("the uncontended semaphore refused a slot")
        semaphore.release(lease)

    return cycle


def lock_cycle(client: redis.Redis) -> Cycle:
    """One uncontended ``acquire(blocking=False)`` + ``release`` of redis-py's ``Lock``."""
    lock = client.lock("bench:lock", timeout=30)

    def cycle() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("the uncontended lock was refused")
        lock.release()

    return cycle


def ping_cycle(client: redis.Redis) -> Cycle:
    """One PING: the floor of any operation that needs one round trip."""

    def cycle() -> None:
        client.ping()

    return cycle


CYCLE_FACTORIES: Dict[str, Callable[[redis.Redis], Cycle]] = {
    SEMAPHORE: semaphore_cycle,
    LOCK: lock_cycle,
    PING: ping_cycle,
}


@dataclass
class CommandCounts:
    """What one cycle costs in commands, counted over many cycles."""

    round_trips: float
    server_commands: float
    processed: float
    server_microseconds: float
    breakdown: Dict[str, float]


@dataclass
class KindResult:
    """Everything measured for one kind of cycle."""

    kind: str
    rates: List[float] = field(default_factory=list)
    counts: Optional[CommandCounts] = None

    @property
    def median_rate(self) -> float:
        """Median cycles per second over the rounds."""
        return median(self.rates)

    @property
    def microseconds_per_cycle(self) -> float:
        """Median time of one cycle, in microseconds."""
        return 1e6 / self.median_rate

    def as_dict(self) -> Dict[str, Any]:
        """Machine-readable form, with the derived numbers."""
        data = asdict(self)
        data["cycles_per_second_median"] = self.median_rate
        data["microseconds_per_cycle"] = self.microseconds_per_cycle
        return data


def time_cycles(cycle: Cycle, cycles: int) -> float:
    """Run ``cycle`` ``cycles`` times; return cycles per second."""
    started = time.perf_counter()
    for _ in range(cycles):
        cycle()
    return cycles / (time.perf_counter() - started)


def count_commands(server: RedisServer, stats_client: redis.Redis, kind: str,
                   cycles: int) -> CommandCounts:
    """Per-cycle round trips, server commands and server time of ``kind``.

    Runs on a fresh counting client. Server time is the ``INFO commandstats`` time of the
    commands the client itself sent (a script's entry covers its inner commands).
    """
    client = CountingRedis(host="127.0.0.1", port=server.port)
    try:
        cycle = CYCLE_FACTORIES[kind](client)
        cycle()  # loads scripts, opens the connection
        client.round_trips = 0
        calls_before, usec_before = command_calls(stats_client), command_usec(stats_client)
        processed_before = commands_processed(stats_client)
        for _ in range(cycles):
            cycle()
        processed_after = commands_processed(stats_client)
        calls_after, usec_after = command_calls(stats_client), command_usec(stats_client)
    finally:
        client.close()
    delta = calls_delta(calls_before, calls_after)
    usec = sum(usec_after.get(name, 0) - usec_before.get(name, 0) for name in client.sent)
    return CommandCounts(
        round_trips=client.round_trips / cycles,
        server_commands=sum(delta.values()) / cycles,
        # processed_before's own INFO is counted in processed_after; nothing else is ours.
        processed=(processed_after - processed_before - 1) / cycles,
        server_microseconds=usec / cycles,
        breakdown={name: calls / cycles for name, calls in delta.items()},
    )


def rotated(items: Sequence[str], by: int) -> List[str]:
    """``items`` rotated left by ``by`` places, so no kind always runs first."""
    shift = by % len(items)
    return list(items[shift:]) + list(items[:shift])


def run(server: RedisServer, cycles: int, rounds: int, warmup: int) -> Dict[str, KindResult]:
    """Measure every kind against ``server``: interleaved timed rounds, then counts."""
    client = server.client()
    stats_client = server.client()
    try:
        cycle_of = {kind: CYCLE_FACTORIES[kind](client) for kind in KINDS}
        results = {kind: KindResult(kind) for kind in KINDS}
        for kind in KINDS:
            time_cycles(cycle_of[kind], warmup)
        for round_index in range(rounds):
            for kind in rotated(KINDS, round_index):
                results[kind].rates.append(time_cycles(cycle_of[kind], cycles))
        for kind in KINDS:
            results[kind].counts = count_commands(
                server, stats_client, kind, min(cycles, 1000)
            )
        return results
    finally:
        client.close()
        stats_client.close()


def summary_table(results: Dict[str, KindResult]) -> str:
    """The results as a markdown table."""
    rows = [
        (
            result.kind,
            result.median_rate,
            result.microseconds_per_cycle,
            f"{min(result.rates):,.0f}-{max(result.rates):,.0f}",
            result.counts.round_trips if result.counts else "?",
            result.counts.server_commands if result.counts else "?",
            result.counts.processed if result.counts else "?",
            result.counts.server_microseconds if result.counts else "?",
        )
        for result in results.values()
    ]
    return markdown_table(
        (
            "kind", "cycles/s (median)", "µs/cycle", "range over rounds",
            "round trips/cycle", "server cmds/cycle (commandstats)",
            "total_commands_processed/cycle", "server µs/cycle",
        ),
        rows,
    )


def report(results: Dict[str, KindResult], cycles: int, rounds: int,
           env: Dict[str, Any]) -> Dict[str, Any]:
    """The machine-readable report, including the ratio against the target."""
    ratio = results[SEMAPHORE].median_rate / results[LOCK].median_rate
    return {
        "benchmark": "semaphore",
        "cycles_per_round": cycles,
        "rounds": rounds,
        "environment": env,
        "results": {kind: result.as_dict() for kind, result in results.items()},
        "ratio_semaphore_over_lock": ratio,
        "target": "Semaphore cycles/s >= redis-py Lock cycles/s",
        "target_met": ratio >= 1.0,
    }


def markdown_report(data: Dict[str, Any], results: Dict[str, KindResult]) -> str:
    """The human-readable report printed to stdout."""
    ratio = data["ratio_semaphore_over_lock"]
    breakdown = "\n".join(
        f"- {kind}: "
        + ", ".join(f"{name} {calls:.2g}" for name, calls in
                    (result.counts.breakdown if result.counts else {}).items())
        for kind, result in results.items()
    )
    return (
        f"## Semaphore vs redis-py Lock ({data['cycles_per_round']} cycles x "
        f"{data['rounds']} rounds, median)\n\n"
        f"{summary_table(results)}\n\n"
        f"Ratio Semaphore/Lock: **{ratio:.3f}** "
        f"(target >= 1.0: {'met' if data['target_met'] else 'NOT met'})\n\n"
        f"Server commands per cycle, by command:\n\n{breakdown}\n"
    )


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=5000, help="cycles per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=500, help="untimed cycles per kind")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, print the markdown report, write results/semaphore.json."""
    args = parse_args(argv)
    with RedisServer() as server:
        results = run(server, args.cycles, args.rounds, args.warmup)
        stats_client = server.client()
        try:
            env = environment(stats_client)
        finally:
            stats_client.close()
    data = report(results, args.cycles, args.rounds, env)
    data["markdown"] = markdown_report(data, results)
    path = write_json("semaphore.json", data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
