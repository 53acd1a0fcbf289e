"""What an uncontended admission costs the lock store: today's ``admit.lua`` against a
slots-only script (``lua/admit_slots_fast.lua``), each followed by the release
(``ZREM``) as the gate sends it, pipelined 100 at a time on one private redis-server.
Reported: the server's µs per admission + release (``INFO commandstats``).

    python -m benchmarks.prototypes.bench_script_cost --calls 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from celery_redislock.engine.keys import semaphore_key
from celery_redislock.engine.scripts import ADMIT
from celery_redislock.testing import RedisServer

from ..common import markdown_table, median, write_json

KEY = semaphore_key("cost:uncontended")
CONTROL = KEY.replace("}:s:", "}:cs:")
FAST = (Path(__file__).with_name("lua") / "admit_slots_fast.lua").read_text()


def usec(client: Any) -> int:
    return sum(int(v["usec"]) for v in client.info("commandstats").values())


def member(token: str, reply: Any) -> str:
    """The holder an admission wrote (see admit.lua's replies)."""
    if isinstance(reply, list):  # {1, now, 0, lease_end, fence, contended, last}
        return f"{token} {int(reply[1])} {int(reply[4])} d"
    now, _, fence = reply.decode().split()[:3]
    return f"{token} {now} {fence} d"


def run(client: Any, kind: str, calls: int, sha: str) -> float:
    before = usec(client)
    pipe = client.pipeline(transaction=False)
    for i in range(calls):
        token = f"{kind}{i}"
        if kind == "admit.lua":
            pipe.evalsha(ADMIT.sha, 1, KEY, token, 60000, "d", "s:1000", 0)
        else:
            pipe.evalsha(sha, 2, KEY, CONTROL, token, 60000, "d", 1000)
        if i % 100 == 99:
            replies = pipe.execute()
            members = [member(f"{kind}{i - 99 + j}", r) for j, r in enumerate(replies)]
            for holder in members:  # the release the gate sends (ZREM of the holder)
                pipe.zrem(KEY, holder)
            pipe.execute()
    pipe.execute()
    return (usec(client) - before) / calls


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    results: Dict[str, List[float]] = {"admit.lua": [], "admit_slots_fast.lua": []}
    with RedisServer() as server:
        client = server.client()
        client.script_load(ADMIT.source)
        sha = client.script_load(FAST)
        for _ in range(args.rounds):
            for kind in results:
                client.delete(KEY)
                results[kind].append(run(client, kind, args.calls, sha))
        client.close()
    base = median(results["admit.lua"])
    rows = [(kind, f"{median(v):.1f}", f"{base / median(v):.2f}") for kind, v in results.items()]
    markdown = (f"## Prototype: an uncontended admission's cost in the lock store "
                f"(load {load:.1f})\n\n" + markdown_table(
                    ("script", "server µs per admission + release (median)",
                     "admit.lua's ÷ this"), rows) + "\n")
    write_json("proto_script_cost.json", {"load": load, "results": results,
                                           "markdown": markdown})
    print(markdown)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
