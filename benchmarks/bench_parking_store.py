"""The parked line's cost in the lock store, with 1,000 and 100,000 references waiting
on one key, side by side in one run (one private redis-server): the server's µs per
call of each step (``INFO commandstats``), and the memory per waiting reference.

Per line length L, on a fresh key of S slots: S newcomers take the free slots
(``admit, free slot``); L runs are refused and park, pipelined (``admit, parks``: the
last 1,000 of them); the S holders release (``release, hands over``: each reserves its
slot for the line and owes a move); S moved copies claim their reservations (``claim``);
their bodies start (``started``: the references become served); one poll (``due``).
Memory: the server's ``used_memory`` grown per reference parked.

    python -m benchmarks.bench_parking_store --lengths 1000 100000 --slots 100
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from celery_redislock.engine.admission import Busy, Lease, SlotLimit, admit, declare_fresh
from celery_redislock.engine.parking import (
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
    """The server's µs per script call over a stretch of calls."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.start = usec_calls(client)

    def per_call(self) -> float:
        end = usec_calls(self.client)
        calls = max(1, end["calls"] - self.start["calls"])
        return (end["usec"] - self.start["usec"]) / calls


def park_many(client: Any, limiters: List[SlotLimit], first: int, count: int) -> List[Any]:
    """``count`` runs refused and parked, pipelined 500 at a time; their outcomes."""
    outcomes: List[Any] = []
    pipe = client.pipeline(transaction=False)
    calls = []
    for i in range(first, first + count):
        call = prepare_park_admit(client, limiters, lease=600, run=run_id(task_id("w", i), 0),
                                  description="bench")
        assert call is not None
        name, sha = call.script.evalsha(client)
        pipe.execute_command(name, sha, len(call.keys), *call.keys, *call.args)
        calls.append(call)
        if len(calls) == 500 or i == first + count - 1:
            replies = pipe.execute()
            outcomes.extend(c.outcome(r) for c, r in zip(calls, replies))
            calls = []
    return outcomes


def measure(client: Any, length: int, slots: int, name: str) -> Dict[str, float]:
    limiters = [SlotLimit(name, slots, "bench:")]
    key = limiters[0].key
    result: Dict[str, float] = {}
    today = [SlotLimit(name + "-today", slots, "bench:")]
    meter = Meter(client)
    leases = [admit(client, today, lease=600) for _ in range(slots)]
    result["today: admit.lua, free slot"] = meter.per_call()
    assert all(isinstance(lease, Lease) for lease in leases)
    for lease in leases:
        lease.release()
    meter = Meter(client)
    holders = [park_admit(client, limiters, lease=600, run=run_id(task_id("h", i), 0))
               for i in range(slots)]
    result["admit, free slot"] = meter.per_call()
    assert all(isinstance(h, Lease) for h in holders)
    memory = int(client.info("memory")["used_memory"])
    parked = park_many(client, limiters, 0, length - 1000)
    meter = Meter(client)
    parked += park_many(client, limiters, length - 1000, 1000)
    result["admit, parks"] = meter.per_call()
    result["bytes per reference"] = (int(client.info("memory")["used_memory"]) - memory) / length
    assert all(isinstance(p, Busy) and p.park for p in parked)
    meter = Meter(client)
    for holder in holders:
        holder.release()
    result["release, hands over"] = meter.per_call()
    assert sum(len(h.handoffs) for h in holders) == slots
    meter = Meter(client)
    claims = [park_admit(client, limiters, lease=600, run=run_id(task_id("w", i), 0),
                         parked=parked[i].park) for i in range(slots)]
    result["claim"] = meter.per_call()
    assert all(isinstance(c, Lease) for c in claims)
    meter = Meter(client)
    for claim in claims:
        started(claim)
    result["started"] = meter.per_call()
    meter = Meter(client)
    for _ in range(100):
        due(client, {key: length - slots})
    result["due (one key)"] = meter.per_call()
    for claim in claims:
        claim.release()
    per_waiting[0] = result["bytes per reference"]
    result["bytes per served reference"] = served_bytes(client, name + "-served", 5000)
    return result


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


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
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
        for number in range(args.rounds):  # the lengths in turn, each round
            for length in args.lengths:
                rounds[length].append(measure(client, length, args.slots,
                                              f"bench-{length}-{number}"))
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
