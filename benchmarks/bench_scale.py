"""Scale: acquire/release latency and Redis memory as keys and holders grow; what idle
keys leave behind.

One private redis-server, one client. Two series, each point on an empty database:

* **keys**: 1, 10, 100, 1,000, 10,000 semaphores (``slots=1``), one holder each;
* **holders**: 1, 10, 100, 1,000 holders of one semaphore with ``slots = holders``.

At each point every slot is taken first. Then ``--samples`` times: pick a held lease at
random, release it and take the slot again (each timed on its own), so the latency is
that of a full semaphore of that size (``slots=1`` keys: the only holder leaves and a new
one comes). Memory is ``INFO memory`` ``used_memory`` minus that of the empty database,
and the sum of ``MEMORY USAGE`` over the keys there. Then every lease is released, and
the keys and memory left right after are reported.

Last, with every point released, the database is polled (``DBSIZE``) until it is empty or
``--ttl-wait`` seconds have passed: the package keeps small per-key statistics for a
while after a key's last use, and nothing should stay for good.

Run from the repository root::

    python -m benchmarks.bench_scale
    python -m benchmarks.bench_scale --samples 500 --ttl-wait 0    # quick, no TTL wait
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import redis

from celery_redislock import Semaphore
from celery_redislock.engine.admission import Lease
from celery_redislock.testing import RedisServer

from .common import environment, markdown_table, write_json
from .contention_metrics import percentile

KEY_COUNTS = (1, 10, 100, 1000, 10000)
HOLDER_COUNTS = (1, 10, 100, 1000)
PREFIX = "redislock:"
TTL_POLL_INTERVAL = 1.0


def used_memory(client: redis.Redis) -> int:
    """``used_memory`` of ``INFO memory``, in bytes (after giving freed pages back)."""
    client.memory_purge()
    return int(client.info("memory")["used_memory"])


def key_bytes(client: redis.Redis) -> int:
    """The sum of ``MEMORY USAGE`` over every key of the database."""
    total = 0
    for key in client.scan_iter(count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
    return total


def timed_cycles(semaphores: Sequence[Semaphore], leases: List[Lease],
                 samples: int) -> Dict[str, List[float]]:
    """``samples`` times: release a random held lease and take its slot back; µs each.

    ``leases[i]`` is held on ``semaphores[i]`` (for one key, the same semaphore)."""
    acquire_us, release_us = [], []
    for _ in range(samples):
        index = random.randrange(len(leases))
        semaphore = semaphores[index]
        started = time.perf_counter()
        semaphore.release(leases[index])
        released = time.perf_counter()
        lease = semaphore.acquire(blocking=False)
        acquired = time.perf_counter()
        if lease is None:
            raise RuntimeError(f"{semaphore!r} refused the slot just released")
        leases[index] = lease
        release_us.append((released - started) * 1e6)
        acquire_us.append((acquired - released) * 1e6)
    return {"acquire": acquire_us, "release": release_us,
            "cycle": [a + r for a, r in zip(acquire_us, release_us)]}


def measure_point(client: redis.Redis, series: str, size: int,
                  samples: int) -> Dict[str, Any]:
    """Fill one point (``size`` keys, or ``size`` holders of one key), time it, release it."""
    client.flushdb()
    empty = used_memory(client)
    if series == "keys":
        semaphores = [Semaphore(client, f"scale:{size}:{index}", slots=1)
                      for index in range(size)]
    else:
        semaphores = [Semaphore(client, f"scale:holders:{size}", slots=size)] * size
    leases = []
    for semaphore in semaphores:
        lease = semaphore.acquire(blocking=False)
        if lease is None:
            raise RuntimeError(f"{semaphore!r} refused a free slot")
        leases.append(lease)
    timed_cycles(semaphores, leases, min(50, samples))  # warm-up
    full_memory = used_memory(client) - empty
    full_key_bytes = key_bytes(client)
    full_keys = int(client.dbsize())
    latency = timed_cycles(semaphores, leases, samples)
    for semaphore, lease in zip(semaphores, leases):
        semaphore.release(lease)
    return {
        "series": series,
        "size": size,
        "keys_held": full_keys,
        "used_memory_bytes": full_memory,
        "key_bytes": full_key_bytes,
        "key_bytes_per_holder": full_key_bytes / size,
        "acquire_p50_us": percentile(latency["acquire"], 0.5),
        "acquire_p99_us": percentile(latency["acquire"], 0.99),
        "release_p50_us": percentile(latency["release"], 0.5),
        "release_p99_us": percentile(latency["release"], 0.99),
        "cycle_p50_us": percentile(latency["cycle"], 0.5),
        "cycle_p99_us": percentile(latency["cycle"], 0.99),
        "keys_left_after_release": int(client.dbsize()),
        "key_bytes_left_after_release": key_bytes(client),
        "used_memory_left_after_release": used_memory(client) - empty,
        "key_types_left": key_types(client),
    }


def key_types(client: redis.Redis) -> Dict[str, int]:
    """How many keys are left, by the part of their name after the prefix's first word."""
    kinds: Dict[str, int] = {}
    for key in client.scan_iter(count=1000):
        name = key.decode(errors="replace")
        kind = name.split(":")[1] if name.startswith(PREFIX) and ":" in name[len(PREFIX):] \
            else name.split(":")[0]
        kind = f"{kind} ({client.type(key).decode()})"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def idle_keys(client: redis.Redis, sizes: Sequence[int], ttl_wait: float) -> Dict[str, Any]:
    """Use ``max(sizes)`` keys once, release them all, then poll until no key is left or
    ``ttl_wait`` seconds have passed."""
    client.flushdb()
    empty = used_memory(client)
    count = max(sizes)
    semaphores = [Semaphore(client, f"idle:{index}", slots=1) for index in range(count)]
    for semaphore in semaphores:
        lease = semaphore.acquire(blocking=False)
        if lease is None:
            raise RuntimeError(f"{semaphore!r} refused a free slot")
        semaphore.release(lease)
    result: Dict[str, Any] = {
        "keys_used": count,
        "keys_left_at_release": int(client.dbsize()),
        "used_memory_left_at_release": used_memory(client) - empty,
        "key_bytes_left_at_release": key_bytes(client),
        "ttl_seconds_left": ttls(client),
        "waited": ttl_wait > 0,
    }
    started = time.monotonic()
    while ttl_wait > 0 and client.dbsize() > 0 and time.monotonic() - started < ttl_wait:
        time.sleep(TTL_POLL_INTERVAL)
    if ttl_wait > 0:
        result.update({
            "seconds_until_empty": time.monotonic() - started if client.dbsize() == 0 else None,
            "keys_left_after_wait": int(client.dbsize()),
            "used_memory_left_after_wait": used_memory(client) - empty,
        })
    return result


def ttls(client: redis.Redis) -> Dict[str, float]:
    """The smallest and largest TTL (s) of the keys left; -1 means a key with none."""
    values = [client.pttl(key) / 1000 for key in client.scan_iter(count=1000)]
    values = [value if value >= 0 else -1.0 for value in values]
    return {"min": min(values), "max": max(values)} if values else {}


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Start Redis, measure both series and the idle keys, stop it; return the report."""
    key_counts = [n for n in KEY_COUNTS if n <= args.max_keys]
    holder_counts = [n for n in HOLDER_COUNTS if n <= args.max_holders]
    with RedisServer() as server:
        client = server.client()
        try:
            measure_point(client, "keys", 10, 50)  # untimed: scripts, buffers, allocator
            points = [measure_point(client, "keys", n, args.samples) for n in key_counts]
            points += [measure_point(client, "holders", n, args.samples)
                       for n in holder_counts]
            idle = idle_keys(client, key_counts, args.ttl_wait)
            machine = environment(client)
        finally:
            client.close()
    return {
        "benchmark": "scale",
        "samples": args.samples,
        "environment": machine,
        "points": points,
        "idle": idle,
        "target": "no key left once the per-key statistics' TTL has passed",
        "target_met": (idle.get("keys_left_after_wait") == 0) if idle["waited"] else None,
    }


def markdown_report(data: Dict[str, Any]) -> str:
    """The human-readable report printed to stdout."""
    rows = [
        (
            f"{point['size']:,} "
            + ("keys x 1 holder" if point["series"] == "keys" else "holders on 1 key"),
            f"{point['acquire_p50_us']:.0f} / {point['acquire_p99_us']:.0f}",
            f"{point['release_p50_us']:.0f} / {point['release_p99_us']:.0f}",
            f"{point['cycle_p50_us']:.0f} / {point['cycle_p99_us']:.0f}",
            f"{point['used_memory_bytes']:,}",
            f"{point['key_bytes_per_holder']:.0f}",
            f"{point['keys_left_after_release']:,}",
            f"{point['key_bytes_left_after_release']:,}",
        )
        for point in data["points"]
    ]
    table = markdown_table(
        ("point", "acquire p50 / p99 µs", "release p50 / p99 µs", "cycle p50 / p99 µs",
         "used_memory held (B)", "key bytes per holder", "keys left at release",
         "key bytes left at release"),
        rows,
    )
    idle = data["idle"]
    ttl = idle["ttl_seconds_left"]
    idle_text = (
        f"{idle['keys_used']:,} keys used once and released: **{idle['keys_left_at_release']:,}"
        f" keys** ({idle['key_bytes_left_at_release']:,} key bytes, used_memory "
        f"{idle['used_memory_left_at_release']:+,} B) right after"
        + (f", TTL {ttl['min']:.0f}-{ttl['max']:.0f} s" if ttl else "")
    )
    if idle["waited"]:
        until = idle["seconds_until_empty"]
        idle_text += (
            f"; **{idle['keys_left_after_wait']} keys** (used_memory "
            f"{idle['used_memory_left_after_wait']:+,} B) "
            + (f"after {until:.0f} s" if until is not None else "when the wait ran out")
        )
    else:
        idle_text += " (the TTL was not waited out: --ttl-wait 0)"
    return (
        f"## Scale: latency and memory ({data['samples']} timed release+acquire pairs "
        f"per point, full semaphores)\n\n{table}\n\n"
        f"Idle keys: {idle_text}.\n\n"
        "Latency of one client on one connection, at a random held lease of a full "
        "semaphore. used_memory: `INFO memory` over the empty database (includes "
        "allocator noise); key bytes: the sum of `MEMORY USAGE` of the keys.\n"
    )


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2000,
                        help="timed release+acquire pairs per point")
    parser.add_argument("--max-keys", type=int, default=max(KEY_COUNTS))
    parser.add_argument("--max-holders", type=int, default=max(HOLDER_COUNTS))
    parser.add_argument("--ttl-wait", type=float, default=120.0,
                        help="seconds to wait for idle keys to expire (0: do not wait)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the benchmark, print the markdown report, write results/scale.json."""
    args = parse_args(argv)
    data = run(args)
    data["markdown"] = markdown_report(data)
    path = write_json("scale.json", data)
    print(data["markdown"])
    print(f"(results written to {path.name} in the results directory)")
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
