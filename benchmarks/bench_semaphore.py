"""Acquire+release cycles per second: ``Semaphore`` versus other Redis locks, and PING.

One private redis-server, one client, one connection, no contention (one slot, nobody
else holds the key). The kinds:

* this package's ``Semaphore(slots=1)``: ``acquire()`` + ``release(lease)``;
* redis-py's ``Lock``: ``acquire(blocking=False)`` + ``release()``;
* python-redis-lock's ``Lock``: ``acquire(blocking=False)`` + ``release()``;
* dramatiq's ``ConcurrentRateLimiter(RedisBackend, limit=1)``: one
  ``with limiter.acquire(raise_on_failure=False)`` block;
* ``PING``: one round trip, the floor of any operation.

The last two libraries are optional (the ``bench`` extra); a kind whose library is
missing is left out and said so. Each kind runs ``--cycles`` cycles per round; rounds are
interleaved (the order rotates each round) and the median round is reported. Server
commands per cycle come from ``INFO commandstats`` deltas (a Lua script's inner commands
count there); round trips per cycle from counting the writes on the client's
connections (a pipeline is one write).

Run from the repository root::

    python -m benchmarks.bench_semaphore --cycles 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

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
PY_REDIS_LOCK = "python-redis-lock Lock"
DRAMATIQ = "dramatiq ConcurrentRateLimiter"
PING = "PING (1 round trip)"
ALL_KINDS = (SEMAPHORE, LOCK, PY_REDIS_LOCK, DRAMATIQ, PING)
#: The library each optional kind needs (the ``bench`` extra).
OPTIONAL = {PY_REDIS_LOCK: "redis_lock", DRAMATIQ: "dramatiq"}

#: Commands whose ``INFO commandstats`` name includes their subcommand (``client|reply``).
CONTAINER_COMMANDS = frozenset({b"client", b"config", b"script", b"object", b"memory"})


class CountingSocket:
    """A socket that counts its writes (each a round trip, or a request sent without
    waiting for a reply) and remembers the names of the commands written; everything else
    is the socket's own. Counting at the socket sees every path to Redis: redis-py's
    commands and pipelines, and the package's channel, which writes to the socket
    itself."""

    writes: int = 0
    sent: Set[str] = set()

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def sendall(self, data: Any, *args: Any) -> None:
        """Count and name, then write as usual."""
        CountingSocket.writes += 1
        # A part of a command split over several writes is counted, not named.
        with contextlib.suppress(ValueError):
            CountingSocket.sent = CountingSocket.sent | command_names(bytes(data))
        self._sock.sendall(data, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class CountingConnection(redis.Connection):
    """A redis-py connection whose socket is a :class:`CountingSocket`."""

    def _connect(self) -> Any:
        return CountingSocket(super()._connect())


def command_names(data: bytes) -> Set[str]:
    """The ``commandstats`` names of the commands in ``data``, in the Redis protocol."""
    names, position = set(), 0
    while position < len(data) and data[position:position + 1] == b"*":
        line_end = data.index(b"\r\n", position)
        count = int(data[position + 1:line_end])
        position = line_end + 2
        words = []
        for _ in range(count):
            line_end = data.index(b"\r\n", position)
            length = int(data[position + 1:line_end])
            words.append(data[line_end + 2:line_end + 2 + length].lower())
            position = line_end + 2 + length + 2
        if words:
            name = words[0]
            if name in CONTAINER_COMMANDS and len(words) > 1:
                name += b"|" + words[1]
            names.add(name.decode())
    return names


def semaphore_cycle(client: redis.Redis) -> Cycle:
    """One uncontended acquire+release of a one-slot ``Semaphore``."""
    semaphore = Semaphore(client, "bench:semaphore", slots=1, lease=30)

    def cycle() -> None:
        lease = semaphore.acquire(blocking=False)
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


def python_redis_lock_cycle(client: redis.Redis) -> Cycle:
    """One uncontended ``acquire(blocking=False)`` + ``release`` of python-redis-lock's
    ``Lock`` (30 s expiry, no auto-renewal, its defaults otherwise)."""
    import redis_lock

    lock = redis_lock.Lock(client, "bench:python-redis-lock", expire=30)

    def cycle() -> None:
        if not lock.acquire(blocking=False):
            raise RuntimeError("the uncontended python-redis-lock was refused")
        lock.release()

    return cycle


def dramatiq_cycle(client: redis.Redis) -> Cycle:
    """One uncontended pass through dramatiq's ``ConcurrentRateLimiter`` (limit 1, its
    default TTL of 900 s) on its ``RedisBackend``."""
    from dramatiq.rate_limits import ConcurrentRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    limiter = ConcurrentRateLimiter(RedisBackend(client=client), "bench:dramatiq", limit=1)

    def cycle() -> None:
        with limiter.acquire(raise_on_failure=False) as acquired:
            if not acquired:
                raise RuntimeError("the uncontended dramatiq limiter was refused")

    return cycle


def ping_cycle(client: redis.Redis) -> Cycle:
    """One PING: the floor of any operation that needs one round trip."""

    def cycle() -> None:
        client.ping()

    return cycle


CYCLE_FACTORIES: Dict[str, Callable[[redis.Redis], Cycle]] = {
    SEMAPHORE: semaphore_cycle,
    LOCK: lock_cycle,
    PY_REDIS_LOCK: python_redis_lock_cycle,
    DRAMATIQ: dramatiq_cycle,
    PING: ping_cycle,
}


def available_kinds() -> Tuple[List[str], List[str]]:
    """The kinds whose library is installed, and those left out for want of it."""
    kinds, missing = [], []
    for kind in ALL_KINDS:
        module = OPTIONAL.get(kind)
        if module is not None and importlib.util.find_spec(module) is None:
            missing.append(kind)
        else:
            kinds.append(kind)
    return kinds, missing


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

    Runs on a fresh client whose sockets count their writes (a plain ``redis.Redis``,
    so the package takes the same path as in the timed rounds). Server time is the
    ``INFO commandstats`` time of the commands the client itself sent (a script's entry
    covers its inner commands).
    """
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port,
                                connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    try:
        cycle = CYCLE_FACTORIES[kind](client)
        cycle()  # loads scripts, opens the connection
        CountingSocket.writes, CountingSocket.sent = 0, set()
        calls_before, usec_before = command_calls(stats_client), command_usec(stats_client)
        processed_before = commands_processed(stats_client)
        for _ in range(cycles):
            cycle()
        processed_after = commands_processed(stats_client)
        calls_after, usec_after = command_calls(stats_client), command_usec(stats_client)
        writes, sent = CountingSocket.writes, CountingSocket.sent
    finally:
        client.close()
        pool.disconnect()
    delta = calls_delta(calls_before, calls_after)
    usec = sum(usec_after.get(name, 0) - usec_before.get(name, 0) for name in sent)
    return CommandCounts(
        round_trips=writes / cycles,
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


def run(server: RedisServer, cycles: int, rounds: int, warmup: int,
        kinds: Sequence[str] = ALL_KINDS) -> Dict[str, KindResult]:
    """Measure ``kinds`` against ``server``: interleaved timed rounds, then counts."""
    client = server.client()
    stats_client = server.client()
    try:
        cycle_of = {kind: CYCLE_FACTORIES[kind](client) for kind in kinds}
        results = {kind: KindResult(kind) for kind in kinds}
        for kind in kinds:
            time_cycles(cycle_of[kind], warmup)
        for round_index in range(rounds):
            for kind in rotated(kinds, round_index):
                results[kind].rates.append(time_cycles(cycle_of[kind], cycles))
        for kind in kinds:
            results[kind].counts = count_commands(
                server, stats_client, kind, min(cycles, 1000)
            )
        return results
    finally:
        client.close()
        stats_client.close()


def summary_table(results: Dict[str, KindResult]) -> str:
    """The results as a markdown table."""
    semaphore_rate = results[SEMAPHORE].median_rate
    rows = [
        (
            result.kind,
            result.median_rate,
            f"{result.median_rate / semaphore_rate:.2f}",
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
            "kind", "cycles/s (median)", "÷ Semaphore", "µs/cycle", "range over rounds",
            "round trips/cycle", "server cmds/cycle (commandstats)",
            "total_commands_processed/cycle", "server µs/cycle",
        ),
        rows,
    )


def report(results: Dict[str, KindResult], cycles: int, rounds: int,
           env: Dict[str, Any], missing: Sequence[str] = ()) -> Dict[str, Any]:
    """The machine-readable report, including the ratio against the target."""
    ratio = results[SEMAPHORE].median_rate / results[LOCK].median_rate
    semaphore_rate = results[SEMAPHORE].median_rate
    return {
        "benchmark": "semaphore",
        "cycles_per_round": cycles,
        "rounds": rounds,
        "environment": env,
        "libraries": library_versions(),
        "results": {kind: result.as_dict() for kind, result in results.items()},
        "left_out": list(missing),
        "ratio_semaphore_over_lock": ratio,
        "ratio_semaphore_over": {
            kind: semaphore_rate / result.median_rate for kind, result in results.items()
        },
        "target": "Semaphore cycles/s >= redis-py Lock cycles/s",
        "target_met": ratio >= 1.0,
    }


def markdown_report(data: Dict[str, Any], results: Dict[str, KindResult]) -> str:
    """The human-readable report printed to stdout."""
    ratio = data["ratio_semaphore_over_lock"]
    left_out = (
        f"Left out (install the `bench` extra): {', '.join(data['left_out'])}\n\n"
        if data["left_out"] else ""
    )
    versions = ", ".join(f"{name} {version}" for name, version in data["libraries"].items())
    breakdown = "\n".join(
        f"- {kind}: "
        + ", ".join(f"{name} {calls:.2g}" for name, calls in
                    (result.counts.breakdown if result.counts else {}).items())
        for kind, result in results.items()
    )
    return (
        f"## Semaphore vs other Redis locks ({data['cycles_per_round']} cycles x "
        f"{data['rounds']} rounds, median)\n\n"
        f"{summary_table(results)}\n\n{left_out}"
        f"Versions: {versions}. Round trips count the client's writes (a pipeline, or "
        "a request sent without waiting for its reply, is one).\n\n"
        f"Ratio Semaphore/Lock: **{ratio:.3f}** "
        f"(target >= 1.0: {'met' if data['target_met'] else 'NOT met'})\n\n"
        f"Server commands per cycle, by command:\n\n{breakdown}\n"
    )


def library_versions() -> Dict[str, str]:
    """Installed versions of the libraries compared, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("redis", "python-redis-lock", "dramatiq"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "not installed"
    return versions


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
    kinds, missing = available_kinds()
    with RedisServer() as server:
        results = run(server, args.cycles, args.rounds, args.warmup, kinds)
        stats_client = server.client()
        try:
            env = environment(stats_client)
        finally:
            stats_client.close()
    data = report(results, args.cycles, args.rounds, env, missing)
    data["markdown"] = markdown_report(data, results)
    path = write_json("semaphore.json", data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
