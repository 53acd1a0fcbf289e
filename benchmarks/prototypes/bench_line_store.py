"""Where a waiting run waits: three designs of the line, measured side by side.

Two private redis-servers on loopback, one the broker, one the lock store. For each
design, a line of ``--waiters`` runs on one key, the same spread over ``--keys`` keys,
and a short line (``--short``, one key) as the reference for a flat drain:

* ``held`` (a): the run is held by one worker; the lock store keeps its ticket and the
  node holding it; a release reserves the slot and wakes that node by ``PUBLISH``;
* ``signed`` (b): the lock store is the only store of the waiting run: its ticket in
  the line and its message (the task signature) signed with HMAC-SHA256 by a key only
  the workers hold; a release reserves the slot and returns the message, which the
  releaser checks and publishes to the broker (the move);
* ``parked`` (c): the run's message waits in the broker, in a parking list per key;
  the lock store only counts the waiters of each key; a release reserves a numbered
  slot and the releaser moves one message from the parking list to the work queue
  (``LMOVE``, atomic in a Redis broker).

Measured per design and line: the lock store's and the broker's memory for the line
(``used_memory`` over the empty servers, per waiter), commands per second on both
servers while the line is parked (nothing runs: ``--idle`` seconds), then a drain of
``--drain`` hand-offs in a closed loop -- release, move, the waiter received from the
work queue (or its wake-up received on the node's channel), its slot claimed -- with the
hand-off latency (release sent to slot claimed) p50/p95 and the drain rate. Every
design uses the same client library and the same number of round trips where it can.

    python -m benchmarks.prototypes.bench_line_store --waiters 100000 --keys 10000
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis
from celery import Signature

from celery_redislock.engine.keys import semaphore_key
from celery_redislock.testing import RedisServer

from ..common import markdown_table, write_json

LUA = Path(__file__).with_name("lua")
SIGNING_KEY = os.urandom(32)
WORK_QUEUE = "celery"
LEASE_MS, RESERVE_MS = 60000, 10000
FILL_BATCH = 1000
DESIGNS = ("held", "signed", "parked")


def sample_signature(task_id: str) -> Signature:
    """A task signature as a waiting run would carry: one argument, Celery's options."""
    return Signature("proj.tasks.sync_customer", (42,), {"full": True}, options={
        "task_id": task_id, "queue": "celery", "priority": 0,
        "headers": {"redislock_wait": {"since": 1764250000000, "attempts": 1}},
    })


def signed(task_id: str) -> str:
    """The signed message the old line parked in the lock store (its format: an
    ``hmac-sha256:<hex>`` line, then content type, encoding, form and body)."""
    text = f"application/json\nutf-8\ntext\n{json.dumps(dict(sample_signature(task_id)))}"
    mac = hmac.new(SIGNING_KEY, text.encode(), hashlib.sha256).hexdigest()
    return f"hmac-sha256:{mac}\n{text}"


def envelope(task_id: str) -> bytes:
    """A broker message as kombu's Redis transport stores it (JSON envelope, base64 body),
    about the size Celery 5 writes for the signature above."""
    body = (b'[[42], {"full": true}, {"callbacks": null, "errbacks": null, "chain": null, '
            b'"chord": null}]')
    return json.dumps({
        "body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "proj.tasks.sync_customer", "id": task_id,
                    "shadow": None, "eta": None, "expires": None, "group": None,
                    "group_index": None, "retries": 0, "timelimit": [None, None],
                    "root_id": task_id, "parent_id": None, "argsrepr": "(42,)",
                    "kwargsrepr": "{'full': True}", "origin": "gen1234@host",
                    "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None,
                    "stamps": {}, "redislock_wait": {"since": 1764250000000, "attempts": 1}},
        "properties": {"correlation_id": task_id, "reply_to": "a0c1f7d2-5b1e-3c8e-9a41",
                       "delivery_mode": 2, "delivery_info": {"exchange": "",
                                                             "routing_key": "celery"},
                       "priority": 0, "body_encoding": "base64",
                       "delivery_tag": "5d2f7a7e-0b1c-4f53-8f0e-1d9c3c5e7b21"},
    }).encode()


class Stores:
    def __init__(self, broker: redis.Redis, lock: redis.Redis) -> None:
        self.broker, self.lock = broker, lock
        self.scripts = {path.stem: lock.register_script(path.read_text())
                        for path in LUA.glob("*.lua")}
        for script in self.scripts.values():
            lock.script_load(script.script)

    def flush(self) -> None:
        self.broker.flushall()
        self.lock.flushall()
        time.sleep(0.2)


def names(key: str) -> Dict[str, str]:
    """A semaphore's companion keys in one hash slot."""
    sem = semaphore_key(key)
    stem = sem.replace("}:s:", "}:")
    return {"sem": sem, "line": stem + ":q", "msgs": stem + ":w", "moving": stem + ":mv",
            "nodes": stem + ":n", "state": stem + ":l", "resv": stem + ":rv",
            "park": "park:" + key}


def fill(stores: Stores, design: str, keys: List[str], waiters: int) -> float:
    """Put ``waiters`` runs in the lines of ``keys`` (round robin), each key's one slot
    taken by a holder 'h0'. Returns the seconds it took."""
    started = time.perf_counter()
    pipe_lock = stores.lock.pipeline(transaction=False)
    pipe_broker = stores.broker.pipeline(transaction=False)
    for key in keys:
        pipe_lock.zadd(names(key)["sem"], {"h0": time.time() * 1000 + 3600e3})
    pipe_lock.execute()
    for i in range(waiters):
        key = keys[i % len(keys)]
        k, ticket = names(key), f"{i:08d}-{os.urandom(6).hex()}"
        park_one(stores, design, k, ticket, pipe_lock, pipe_broker)
        if (i + 1) % FILL_BATCH == 0:
            pipe_lock.execute()
            pipe_broker.execute()
    pipe_lock.execute()
    pipe_broker.execute()
    return time.perf_counter() - started


def park_one(stores: Stores, design: str, k: Dict[str, str], ticket: str,
             pipe_lock: Any, pipe_broker: Any) -> None:
    s = stores.scripts
    if design == "held":
        s["held_park"](keys=[k["line"], k["nodes"]], args=[ticket, "celery@host-1"],
                       client=pipe_lock)
    elif design == "signed":
        s["signed_park"](keys=[k["line"], k["msgs"]], args=[ticket, signed(ticket)],
                         client=pipe_lock)
    else:
        s["parked_park"](keys=[k["state"]], client=pipe_lock)
        pipe_broker.rpush(k["park"], envelope(ticket))


def idle_commands(stores: Stores, seconds: float) -> Tuple[float, float]:
    """Commands per second each server processed while nobody did anything (less the
    one INFO this function sends to each at each end)."""
    before = [c.info("stats")["total_commands_processed"] for c in (stores.lock, stores.broker)]
    time.sleep(seconds)
    after = [c.info("stats")["total_commands_processed"] for c in (stores.lock, stores.broker)]
    return tuple((a - b - 1) / seconds for a, b in zip(after, before))  # type: ignore


def verify(message: str) -> str:
    """The releaser's check of a signed message before it is published."""
    mark, _, text = message.partition("\n")
    expected = hmac.new(SIGNING_KEY, text.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mark.split(":", 1)[1], expected):
        raise ValueError("forged entry")
    return text


def drain(stores: Stores, design: str, keys: List[str], count: int) -> Dict[str, Any]:
    """``count`` hand-offs, one after another, over ``keys`` round robin."""
    s, lock, broker = stores.scripts, stores.lock, stores.broker
    holders = {key: "h0" for key in keys}
    pubsub = lock.pubsub(ignore_subscribe_messages=True)
    if design == "held":
        pubsub.subscribe("wake:celery@host-1")
        while pubsub.get_message(timeout=0.1) is not None:
            pass
    latencies: List[float] = []
    usec_before = [server_usec(c) for c in (lock, broker)]
    started = time.perf_counter()
    for i in range(count):
        key = keys[i % len(keys)]
        k, member = names(key), f"h{i + 1}"
        t0 = time.perf_counter()
        if design == "held":
            ticket = s["held_release"](keys=[k["sem"], k["line"], k["nodes"]],
                                       args=[holders[key], RESERVE_MS])
            message = pubsub.get_message(timeout=5.0)  # the node hears its wake-up
            assert message is not None and message["data"] == ticket, message
            ok = s["claim"](keys=[k["sem"], "", ""], args=[ticket, member, LEASE_MS])
        elif design == "signed":
            ticket, body = s["signed_release"](keys=[k["sem"], k["line"], k["msgs"],
                                                     k["moving"]],
                                               args=[holders[key], RESERVE_MS])
            broker.lpush(WORK_QUEUE, verify(body.decode()))
            _, _ = broker.brpop([WORK_QUEUE], timeout=5)  # the worker receives it
            ok = s["claim"](keys=[k["sem"], k["msgs"], k["moving"]],
                            args=[ticket, member, LEASE_MS])
        else:
            assert s["parked_release"](keys=[k["sem"], k["state"], k["resv"]],
                                       args=[holders[key], RESERVE_MS]) == 1
            assert broker.lmove(k["park"], WORK_QUEUE, "LEFT", "RIGHT") is not None
            _, _ = broker.brpop([WORK_QUEUE], timeout=5)
            ok = s["parked_claim"](keys=[k["sem"], k["resv"]], args=[member, LEASE_MS])
        latencies.append(time.perf_counter() - t0)
        assert ok == 1
        holders[key] = member
    elapsed = time.perf_counter() - started
    usec = [server_usec(c) - b for c, b in zip((lock, broker), usec_before)]
    pubsub.close()
    latencies.sort()
    return {"rate": count / elapsed, "server_us_per_handoff": sum(usec) / count,
            "p50_ms": statistics.median(latencies) * 1000,
            "p95_ms": latencies[int(len(latencies) * 0.95)] * 1000}


def server_usec(client: redis.Redis) -> int:
    """Microseconds the server spent in commands so far (INFO commandstats)."""
    return sum(int(v["usec"]) for v in client.info("commandstats").values())


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(stores: Stores, design: str, keys: List[str], waiters: int,
            args: argparse.Namespace) -> Dict[str, Any]:
    stores.flush()
    base_lock, base_broker = used_memory(stores.lock), used_memory(stores.broker)
    fill_seconds = fill(stores, design, keys, waiters)
    lock_bytes = used_memory(stores.lock) - base_lock
    broker_bytes = used_memory(stores.broker) - base_broker
    idle_lock, idle_broker = idle_commands(stores, args.idle)
    row: Dict[str, Any] = {
        "design": design, "keys": len(keys), "waiters": waiters,
        "fill_us_per_waiter": fill_seconds / waiters * 1e6,
        "lock_store_mb": lock_bytes / 1e6, "lock_bytes_per_waiter": lock_bytes / waiters,
        "broker_mb": broker_bytes / 1e6, "broker_bytes_per_waiter": broker_bytes / waiters,
        "idle_cmds_per_s_lock": idle_lock, "idle_cmds_per_s_broker": idle_broker,
    }
    row.update(drain(stores, design, keys, min(args.drain, waiters)))
    return row


def run(args: argparse.Namespace) -> List[Dict[str, Any]]:
    rows = []
    layouts = [("one key", [f"line:{0}"], args.waiters),
               (f"{args.keys} keys", [f"line:{i}" for i in range(args.keys)], args.waiters),
               ("one key, short", ["line:short"], args.short)]
    with RedisServer() as broker_server, RedisServer() as lock_server:
        stores = Stores(broker_server.client(), lock_server.client())
        for layout, keys, waiters in layouts:
            for design in DESIGNS:
                row = measure(stores, design, keys, waiters, args)
                row["layout"] = layout
                rows.append(row)
                print(f"  {layout:>14} {design:>7}: {row}", file=sys.stderr, flush=True)
        stores.broker.close()
        stores.lock.close()
    return rows


def report(rows: List[Dict[str, Any]], args: argparse.Namespace, load: float) -> str:
    short = {row["design"]: row for row in rows if row["layout"] == "one key, short"}
    table = []
    for row in rows:
        drained = row.get("rate")
        flat = ""
        if drained and row["layout"] == "one key":
            reference = short[row["design"]]["server_us_per_handoff"]
            flat = f"{reference / row['server_us_per_handoff']:.2f}"
        table.append((
            row["design"], row["layout"], f"{row['waiters']:,}", f"{row['lock_store_mb']:.1f}",
            f"{row['lock_bytes_per_waiter']:.0f}", f"{row['broker_mb']:.1f}",
            f"{row['idle_cmds_per_s_lock']:.1f} / {row['idle_cmds_per_s_broker']:.1f}",
            f"{row['fill_us_per_waiter']:.0f}",
            f"{row['p50_ms']:.2f} / {row['p95_ms']:.2f}" if drained else "n/a",
            f"{drained:,.0f}" if drained else "n/a",
            f"{row['server_us_per_handoff']:.0f}" if drained else "n/a", flat))
    return (f"## Prototype lines: where a waiting run waits (load {load:.1f})\n\n" +
            markdown_table(("design", "line", "waiters", "lock store MB",
                            "lock store B/waiter", "broker MB",
                            "cmds/s parked (lock / broker)", "fill µs/waiter",
                            "hand-off ms p50 / p95", "drain hand-offs/s",
                            "server µs/hand-off (both)", "short line's µs ÷ this"), table) +
            f"\n\nDrain: {args.drain} hand-offs in one closed loop (release, move, "
            "receive, claim), one after another; latency from the release sent to the "
            "slot claimed, without a Celery worker's own delivery time. Server µs: the time both "
            "redis-servers spent in commands per hand-off (INFO commandstats), the part "
            "of the cost that could grow with the line; its ratio, one key of 1,000 over one "
            "key of 100,000, is the flatness of the drain (1: flat). The wall-clock drain "
            "rate and latencies move with the machine's load (other processes share its "
            "two cores).\n")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiters", type=int, default=100000)
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--short", type=int, default=1000)
    parser.add_argument("--drain", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=3.0)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rows = run(args)
    data = {"benchmark": "proto_line_store", "args": vars(args), "load": load, "rows": rows}
    data["markdown"] = report(rows, args, load)
    write_json("proto_line_store.json", data)
    print(data["markdown"])
    return data


if __name__ == "__main__":
    main(sys.argv[1:])
