"""Fair shares on the new line (the next issue): a ring of tenants' turns, measured.

The line of one key is split in one sub-line per tenant; ``lua/fair_park.lua`` puts a
reference in its tenant's sub-line and gives a tenant that starts waiting its turn
(start-time fair queuing); ``lua/fair_release.lua`` hands a freed slot to the tenant of
the lowest turn (one ``ZRANGE 0 0``) and moves that tenant's turn on by 1 / weight.
Measured on one private redis-server:

* the cost of a hand-off with 1, 1,000 and 10,000 tenants waiting (``--waiters`` spread
  evenly): the server's µs per release (``INFO commandstats``), and their ratio;
* the issue's scenario: one tenant's backlog of ``--backlog`` runs sent first, then 20
  tenants with 5 runs each: at which hand-off the last of those 100 runs is served
  (first come first served: after the whole backlog; a fair share: about 200);
* weights: tenants A (weight 3) and B (weight 1), 4,000 runs each: A's share of the
  first 2,000 hand-offs (3 / 4 = 0.75 is exact).

    python -m benchmarks.prototypes.bench_fair
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from celery_redislock.engine.keys import semaphore_key
from celery_redislock.testing import RedisServer

from ..common import markdown_table, write_json

LUA = Path(__file__).with_name("lua")
SEM = semaphore_key("fair:global")
STEM = SEM.replace("}:s:", "}:")
TURNS, STATE, WEIGHTS, LINES = STEM + ":t", STEM + ":f", STEM + ":wt", STEM + ":q:"


class Fair:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.park = client.register_script((LUA / "fair_park.lua").read_text())
        self.release = client.register_script((LUA / "fair_release.lua").read_text())

    def fill(self, runs: List[Tuple[str, str]]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for done, (tenant, reference) in enumerate(runs):
            self.park(keys=[TURNS, LINES + tenant, STATE], args=[tenant, reference],
                      client=pipe)
            if done % 2000 == 1999:
                pipe.execute()
        pipe.execute()

    def serve(self, count: int) -> Tuple[List[str], float]:
        """``count`` hand-offs; the tenants served in order, and server µs per hand-off."""
        before = self.usec()
        served = []
        for _ in range(count):
            tenant, _ = self.release(keys=[SEM, TURNS, STATE, WEIGHTS, LINES], args=["h"])
            served.append(tenant.decode())
        return served, (self.usec() - before) / count

    def usec(self) -> int:
        stats = self.client.info("commandstats")
        return sum(int(v["usec"]) for k, v in stats.items() if k in ("cmdstat_evalsha",))


def cost(fair: Fair, tenants: int, waiters: int, drain: int) -> Dict[str, Any]:
    fair.client.flushall()
    per = max(1, waiters // tenants)
    fair.fill([(f"t{t}", f"r{t}.{i}") for i in range(per) for t in range(tenants)])
    started = time.perf_counter()
    served, usec = fair.serve(drain)
    wall = (time.perf_counter() - started) / drain * 1e6
    distinct = len(set(served[:min(tenants, drain)]))
    return {"tenants": tenants, "waiters": per * tenants, "server_us": usec,
            "wall_us": wall, "round_robin": distinct == min(tenants, drain)}


def backlog(fair: Fair, size: int) -> Dict[str, Any]:
    fair.client.flushall()
    runs = [("big", f"b{i}") for i in range(size)]
    runs += [(f"small{t}", f"s{t}.{i}") for t in range(20) for i in range(5)]
    fair.fill(runs)
    served, _ = fair.serve(400)
    last = max(i for i, tenant in enumerate(served) if tenant.startswith("small")) + 1
    return {"backlog": size, "last_small_served_at": last, "fifo_would_be": size + 100}


def weights(fair: Fair) -> Dict[str, Any]:
    fair.client.flushall()
    fair.client.hset(WEIGHTS, mapping={"A": 3, "B": 1})
    fair.fill([(tenant, f"{tenant}{i}") for i in range(4000) for tenant in ("A", "B")])
    served, _ = fair.serve(2000)
    return {"share_of_A": served.count("A") / len(served)}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, nargs="+", default=[1, 1000, 10000])
    parser.add_argument("--waiters", type=int, default=20000)
    parser.add_argument("--drain", type=int, default=3000)
    parser.add_argument("--backlog", type=int, default=10000)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    with RedisServer() as server:
        fair = Fair(server.client())
        rows = [cost(fair, tenants, args.waiters, args.drain) for tenants in args.tenants]
        scenario = backlog(fair, args.backlog)
        weighted = weights(fair)
        fair.client.close()
    table = markdown_table(
        ("tenants waiting", "runs waiting", "server µs per hand-off", "÷ one tenant's",
         "client µs per hand-off", "first hand-offs one per tenant"),
        [(f"{r['tenants']:,}", f"{r['waiters']:,}", f"{r['server_us']:.1f}",
          f"{rows[0]['server_us'] / r['server_us']:.2f}", f"{r['wall_us']:.0f}",
          "yes" if r["round_robin"] else "no") for r in rows])
    markdown = (f"## Prototype fair shares on the line (load {load:.1f})\n\n{table}\n\n"
                f"A backlog of {scenario['backlog']:,} runs of one tenant sent first, then "
                f"20 tenants x 5 runs: the last of those 100 served at hand-off "
                f"{scenario['last_small_served_at']} (first come first served: "
                f"{scenario['fifo_would_be']:,}). Weights 3 : 1: tenant A had "
                f"{weighted['share_of_A']:.3f} of the first 2,000 hand-offs (0.75 exact).\n")
    data = {"benchmark": "proto_fair", "load": load, "rows": rows, "backlog": scenario,
            "weights": weighted, "markdown": markdown}
    write_json("proto_fair.json", data)
    print(markdown)
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
