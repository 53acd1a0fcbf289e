"""The parked line's cost in the lock store, with 1,000 and 100,000 references waiting
on one key, side by side in one run (one private redis-server): the server's µs per
call of each step (``INFO commandstats``), and the memory per waiting reference.

Per line length L, on a fresh key of S slots: S newcomers take the free slots
(``admit, free slot``); L runs are refused and park, pipelined (``admit, parks``: the
last 1,000 of them); the S holders release (``release, hands over``: each reserves its
slot for the line and owes a move); S moved copies claim their reservations (``claim``);
their bodies start (``started``: the references become served); 100 polls (``due``).
Each step is measured in chunks, the lengths in turn, so that every length meets the
same load. Memory: the server's ``used_memory`` grown per reference parked, and per
served reference (5,000 hand-offs on a key of one slot).

    python -m benchmarks.bench_parking_store --lengths 1000 100000 --slots 100
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from celery_redislock.engine.admission import Busy, Lease, SlotLimit, admit, declare_fresh
from celery_redislock.engine.parking import (
    ParkAsk,
    due,
    park_admit,
    prepare_park_admit,
    run_id,
    started,
)
from celery_redislock.testing import RedisServer

from .common import markdown_table, median, write_json


def task_id(kind: str, number: int) -> str:
    """A task id as long as Celery's (a UUID): the references' size depends on it."""
    return f"{number:08d}-0000-4000-8000-{kind:0>12}"


def usec_calls(client: Any) -> Dict[str, int]:
    """The scripts' calls and time (a script's time includes its commands', which Redis
    also counts under their own names: only the scripts' are summed)."""
    stats = client.info("commandstats")
    scripts = [v for name, v in stats.items() if name in ("cmdstat_evalsha", "cmdstat_eval")]
    return {"usec": sum(int(v["usec"]) for v in scripts),
            "calls": sum(int(v["calls"]) for v in scripts)}


class Meter:
    """The server's µs per script call, summed over stretches of calls."""

    def __init__(self) -> None:
        self.usec = 0
        self.calls = 0

    def measure(self, client: Any, work: Callable[[], Any]) -> Any:
        start = usec_calls(client)
        result = work()
        end = usec_calls(client)
        self.usec += end["usec"] - start["usec"]
        self.calls += end["calls"] - start["calls"]
        return result

    def per_call(self) -> float:
        return self.usec / max(1, self.calls)


def park_many(client: Any, limiters: List[SlotLimit], first: int, count: int) -> List[Any]:
    """``count`` runs refused and parked, pipelined 500 at a time; their outcomes."""
    outcomes: List[Any] = []
    pipe = client.pipeline(transaction=False)
    calls = []
    for i in range(first, first + count):
        call = prepare_park_admit(client, limiters, ParkAsk(
            lease=600, run=run_id(task_id("w", i), 0), description="bench"))
        assert call is not None
        name, sha = call.script.evalsha(client)
        pipe.execute_command(name, sha, len(call.keys), *call.keys, *call.args)
        calls.append(call)
        if len(calls) == 500 or i == first + count - 1:
            replies = pipe.execute()
            outcomes.extend(c.outcome(r) for c, r in zip(calls, replies))
            calls = []
    assert all(isinstance(outcome, Busy) and outcome.park for outcome in outcomes)
    return outcomes


@dataclass
class Line:
    """One key and its line of ``length`` references, as the steps leave them."""

    length: int
    limiters: List[SlotLimit]
    meters: Dict[str, Meter] = field(default_factory=dict)
    holders: List[Any] = field(default_factory=list)
    parked: List[Any] = field(default_factory=list)
    claims: List[Any] = field(default_factory=list)
    memory: float = 0.0

    def meter(self, step: str) -> Meter:
        return self.meters.setdefault(step, Meter())


def interleaved(client: Any, lines: List[Line], step: str, chunks: int,
                work: Callable[[Line, int], Any]) -> None:
    """``work(line, chunk)`` for chunk after chunk, the lines in turn: every length is
    measured over the same stretch of time (the machine's load moves)."""
    for chunk in range(chunks):
        for line in lines:
            line.meter(step).measure(client, functools.partial(work, line, chunk))


def measure(client: Any, lengths: Sequence[int], slots: int,
            tag: str) -> Dict[int, Dict[str, float]]:
    lines = [Line(length, [SlotLimit(f"bench-{tag}-{length}", slots, "bench:")])
             for length in lengths]
    today = {line.length: [SlotLimit(f"today-{tag}-{line.length}", slots, "bench:")]
             for line in lines}
    chunk = 10

    def admit_today(line: Line, number: int) -> None:
        for _ in range(chunk):
            lease = admit(client, today[line.length], lease=600)
            assert isinstance(lease, Lease)
            lease.release()

    interleaved(client, lines, "today: admit.lua, free slot (+ release)", slots // chunk,
                admit_today)

    def take(line: Line, number: int) -> None:
        line.holders += [park_admit(client, line.limiters, lease=600,
                                    run=run_id(task_id("h", number * chunk + i), 0))
                         for i in range(chunk)]

    interleaved(client, lines, "admit, free slot", slots // chunk, take)
    for line in lines:
        assert all(isinstance(h, Lease) for h in line.holders)
        line.memory = waiting_bytes(client, f"waiting-{tag}-{line.length}", line.length)
        line.parked = park_many(client, line.limiters, 0, line.length - 1000)

    def park(line: Line, number: int) -> None:
        line.parked += park_many(client, line.limiters, line.length - 1000 + number * 100, 100)

    interleaved(client, lines, "admit, parks", 10, park)

    def release(line: Line, number: int) -> None:
        for holder in line.holders[number * chunk:(number + 1) * chunk]:
            holder.release()

    interleaved(client, lines, "release, hands over", slots // chunk, release)

    def claim(line: Line, number: int) -> None:
        for i in range(number * chunk, (number + 1) * chunk):
            outcome = park_admit(client, line.limiters, lease=600,
                                 run=run_id(task_id("w", i), 0), parked=line.parked[i].park)
            assert isinstance(outcome, Lease), outcome
            line.claims.append(outcome)

    interleaved(client, lines, "claim", slots // chunk, claim)

    def start(line: Line, number: int) -> None:
        for lease in line.claims[number * chunk:(number + 1) * chunk]:
            started(lease)

    interleaved(client, lines, "started", slots // chunk, start)

    def poll(line: Line, number: int) -> None:
        due(client, {line.limiters[0].key: line.length - slots})

    interleaved(client, lines, "due (one key)", 100, poll)
    results: Dict[int, Dict[str, float]] = {}
    for line in lines:
        results[line.length] = {step: meter.per_call() for step, meter in line.meters.items()}
        results[line.length]["bytes per waiting reference"] = line.memory
        for lease in line.claims:
            lease.release()
    for line in lines:
        per_waiting[0] = line.memory
        results[line.length]["bytes per served reference"] = served_bytes(
            client, f"served-{tag}-{line.length}", 5000)
    return results


def waiting_bytes(client: Any, name: str, count: int) -> float:
    """The memory per waiting reference: ``count`` runs parked on a key of one slot."""
    limiters = [SlotLimit(name, 1, "bench:")]
    assert isinstance(park_admit(client, limiters, lease=600, run=run_id("first", 0)), Lease)
    before = int(client.info("memory")["used_memory"])
    park_many(client, limiters, 0, count)
    memory = (int(client.info("memory")["used_memory"]) - before) / count
    client.delete(*client.keys(limiters[0].key.replace("}:s:", "}:*:", 1)))
    return memory


def served_bytes(client: Any, name: str, count: int) -> float:
    """The memory kept per served reference: on a key of one slot, ``count`` runs parked,
    then ``count`` hand-offs (a release, the moved copy's claim, its start)."""
    limiters = [SlotLimit(name, 1, "bench:")]
    holder = park_admit(client, limiters, lease=600, run=run_id("first", 0))
    assert isinstance(holder, Lease)
    parked = park_many(client, limiters, 0, count)
    memory = int(client.info("memory")["used_memory"])
    for index in range(count):
        holder.release()
        holder = park_admit(client, limiters, lease=600, run=run_id(task_id("w", index), 0),
                            parked=parked[index].park)
        assert isinstance(holder, Lease), holder
        started(holder)
    holder.release()
    # What is left: the served references, the waiting ones gone.
    return (int(client.info("memory")["used_memory"]) - memory) / count + per_waiting[0]


#: The memory per waiting reference last measured (a served one replaced it).
per_waiting = [0.0]


def main(argv: Optional[Sequence[str]] = None) -> Dict[int, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 100000])
    parser.add_argument("--slots", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rounds: Dict[int, List[Dict[str, float]]] = {length: [] for length in args.lengths}
    with RedisServer() as server:
        client = server.client()
        declare_fresh(client, "bench:")
        for number in range(args.rounds):
            measured = measure(client, args.lengths, args.slots, str(number))
            for length in args.lengths:
                rounds[length].append(measured[length])
            client.flushall()
            declare_fresh(client, "bench:")
        client.close()
    results = {length: {step: median([r[step] for r in runs]) for step in runs[0]}
               for length, runs in rounds.items()}
    steps = list(results[args.lengths[0]])
    rows = [(step, *(f"{results[length][step]:.1f}" for length in args.lengths))
            for step in steps]
    markdown = (f"## The parked line in the lock store (load {load:.1f}, {args.slots} "
                f"slots, median of {args.rounds} rounds)\n\n" + markdown_table(
                    ("server µs per call", *(f"{length:,} waiting" for length in args.lengths)),
                    rows) + "\n")
    write_json("parking_store.json", {"load": load, "results": results,
                                      "markdown": markdown})
    print(markdown)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
