"""What operators see of the parked line (``redislock_line = "broker"``): the engine's
read-only view (``engine/parked_view.py``), the ``status``/``inspect``/``watch`` commands,
the dashboard's JSON and the Prometheus gauges, on the session's private redis-server
(lock store in one database, a Redis broker in another). The parked state is built with
``engine.parking``'s public functions and the broker side's ``park``."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner
from kombu import Connection

from celery_redislock import LimitedTask
from celery_redislock.admin.cli import LockStore, redislock
from celery_redislock.admin.watch import render
from celery_redislock.engine import parked_view
from celery_redislock.engine.admission import (
    Busy,
    Lease,
    ParkedMove,
    SlotLimit,
    declare_fresh,
)
from celery_redislock.engine.fair import set_weight
from celery_redislock.engine.keys import semaphore_key
from celery_redislock.engine.parked_view import ParkedLine, read_parked_lines
from celery_redislock.engine.parking import (
    ParkAsk,
    due,
    park_admit,
    parked_index,
    prepare_park_admit,
    run_id,
    started,
)
from celery_redislock.metrics.parked import ParkedLinesCollector
from celery_redislock.parking import ParkedCopy, Route, broker_for, parking_queue
from celery_redislock.web.state import Dashboard

from support import BROKER_DB, LOCK_DB

PREFIX = "redislock:"
PARKING_LUA = (Path(__file__).resolve().parent.parent / "celery_redislock" / "engine" / "lua"
               / "parking.lua")


def invoke(app: Celery, *args: str) -> Any:
    """Run ``celery redislock <args>`` in-process, stderr kept apart."""
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click 8.2+: always apart
        runner = CliRunner()
    return runner.invoke(redislock, list(args), obj=obj)


def now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def ask(client: Any, name: str, task: str, **options: Any) -> Any:
    return park_admit(client, [SlotLimit(name, 1, PREFIX)], lease=options.pop("lease", 30),
                      run=run_id(task, 0), **options)


def parked_line(client: Any, name: str, waiting: int) -> List[Any]:
    """Limit ``name`` (1 slot) held by one run, with ``waiting`` runs parked behind it;
    the outcomes, the holder's Lease first."""
    outcomes = [ask(client, name, f"{name}-{n}") for n in range(waiting + 1)]
    assert isinstance(outcomes[0], Lease)
    assert all(isinstance(o, Busy) and o.park is not None for o in outcomes[1:])
    return outcomes


def park_copies(broker_url: str, name: str, count: int) -> None:
    """``count`` messages in the parking queue of ``name``'s semaphore, as the broker side
    parks them."""
    key = semaphore_key(name, PREFIX)
    with Connection(broker_url) as connection:
        broker = broker_for(connection)
        for n in range(count):
            copy = ParkedCopy(key=key, queue=parking_queue(key), body=b"{}",
                              content_type="application/json", content_encoding="utf-8",
                              headers={"id": f"{name}-{n}"}, route=Route("", "work"))
            assert broker.park(copy, job_id=uuid.uuid4().hex).done


# --- the engine's view ---------------------------------------------------------------


def test_marks_are_those_of_parking_lua() -> None:
    """The companions' marks and the index's name are parking.lua's: its header names
    each, and parked_names.lua's parked_key and its parked_index build them so."""
    header = PARKING_LUA.read_text()
    for mark, meaning in ((parked_view.COUNTS, "the line's counts"),
                          (parked_view.RESERVATIONS, "reservation number"),
                          (parked_view.CLAIMS, "holder token"),
                          (parked_view.SERVED, "served reference is forgotten")):
        kinds = r"(hash|sorted set|list)[\s\S]{0,120}?"
        assert re.search(rf"'}}:{mark}:'\s+" + kinds + meaning, header), mark
    assert "'w' references waiting, 'a' anonymous entries" in header
    assert "'<prefix>parked'" in header and "'parked'" in header
    names = (PARKING_LUA.parent / "parked_names.lua").read_text()  # parked_key, claim_ends
    assert "string.sub(key, 1, at) .. ':' .. mark .. ':'" in names
    assert "parked_key(key, 'pe')" in names
    assert parked_index("p:") == "p:" + parked_view.INDEX_NAME
    key = semaphore_key("x", "p:")
    assert parked_view.parked_index_of(key) == parked_index("p:")


def test_counts_follow_the_line_through_park_move_claim_and_serve(redis_client: Any) -> None:
    name = "view"
    key = semaphore_key(name, PREFIX)
    before = now_ms(redis_client)
    outcomes = parked_line(redis_client, name, 3)
    line = read_parked_lines(redis_client, [key], now_ms(redis_client))[key]
    assert (line.references_waiting, line.anonymous, line.waiting) == (3, 0, 3)
    assert (line.reserved, line.claimed, line.served) == (0, 0, 0)
    assert line.last_parked_ms is not None and line.last_parked_ms >= before
    assert line.oldest_age is None  # not kept in a form readable in O(log n)

    holder = outcomes[0]
    assert holder.release() and holder.handoffs == [ParkedMove(key)]
    line = read_parked_lines(redis_client, [key], now_ms(redis_client))[key]
    assert (line.waiting, line.reserved, line.claimed) == (3, 1, 0)

    moved = ask(redis_client, name, f"{name}-1", parked=outcomes[1].park)
    assert isinstance(moved, Lease)
    line = read_parked_lines(redis_client, [key], now_ms(redis_client))[key]
    assert (line.waiting, line.reserved, line.claimed, line.served) == (2, 0, 1, 0)

    assert started(moved) == 1
    line = read_parked_lines(redis_client, [key], now_ms(redis_client))[key]
    assert (line.waiting, line.reserved, line.claimed, line.served) == (2, 0, 0, 1)


def test_anonymous_entries_and_keys_without_a_parked_line(redis_client: Any) -> None:
    name = "anonymous"
    key = semaphore_key(name, PREFIX)
    parked_line(redis_client, name, 2)
    # The first poll in an incarnation counts the parking queue: 5 messages, 2 known.
    due(redis_client, {key: 5})
    plain = semaphore_key("plain", PREFIX)
    assert park_admit(redis_client, [SlotLimit("plain", 2, PREFIX)], lease=5,
                      run=run_id("p", 0))
    lines = read_parked_lines(redis_client, [key, plain, semaphore_key("none", PREFIX)],
                              now_ms(redis_client))
    assert set(lines) == {key}  # a lease alone, or nothing, is no parked line
    assert (lines[key].references_waiting, lines[key].anonymous, lines[key].waiting) == (2, 3, 5)


def test_reading_costs_the_same_at_10_and_20000_waiting(own_redis_server: Any) -> None:
    """Every read is O(1) or O(log n): the server's µs per read do not grow with the
    line (INFO commandstats, so the machine's load matters little)."""
    # A server of its own: INFO commandstats counts every client's commands, and on the
    # shared server another client (a thread an earlier test left behind) adds to them.
    redis_client = own_redis_server.client()
    declare_fresh(redis_client)  # emptied on purpose: not a store that lost its data

    def cost(key: str) -> float:
        redis_client.config_resetstat()
        for _ in range(300):
            read_parked_lines(redis_client, [key], now_ms(redis_client))
        stats = redis_client.info("commandstats")
        used = [stats[f"cmdstat_{c}"] for c in ("hmget", "zcount", "hlen", "zscore")]
        return sum(s["usec"] for s in used) / 300

    small, big = semaphore_key("small", PREFIX), semaphore_key("big", PREFIX)
    parked_line(redis_client, "small", 10)
    park_many(redis_client, "big", 20000)
    line = read_parked_lines(redis_client, [big], now_ms(redis_client))[big]
    assert line.references_waiting == 20000
    costs = [(cost(small), cost(big)) for _ in range(3)]
    small_us, big_us = min(c[0] for c in costs), min(c[1] for c in costs)
    print(f"server µs per read: {small_us:.1f} at 10 waiting, {big_us:.1f} at 20,000")
    assert big_us < 2 * small_us + 5, costs


def park_many(client: Any, name: str, count: int) -> None:
    """``count`` runs parked on ``name`` (1 slot, held), pipelined as a gate sends them."""
    assert isinstance(ask(client, name, "holder"), Lease)
    limit = [SlotLimit(name, 1, PREFIX)]
    for start in range(0, count, 1000):
        pipe = client.pipeline(transaction=False)
        for n in range(start, min(count, start + 1000)):
            call = prepare_park_admit(client, limit, ParkAsk(lease=30, run=run_id(f"m{n}", 0)))
            assert call is not None
            pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
        pipe.execute()


# --- the views --------------------------------------------------------------------------


@pytest.fixture
def broker_url(redis_server: Any) -> Iterator[str]:
    client = redis_server.client(db=BROKER_DB)
    client.flushdb()
    yield f"redis://127.0.0.1:{redis_server.port}/{BROKER_DB}"
    client.close()


def views_app(redis_server: Any, broker: str) -> Celery:
    """An app on a broker line whose task ``views.fetch`` takes ``fetch:{site}``."""
    app = Celery("views", broker=broker, set_as_current=False)
    app.conf.update(redislock_url=f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}",
                    redislock_line="broker", redislock_metrics_max_limits=3)

    @app.task(base=LimitedTask, lock_slots=1, lock_key="fetch:{site}", name="views.fetch",
              shared=False)
    def fetch(site: str) -> None:
        return None

    return app


@pytest.fixture
def parked(redis_server: Any, lock_client: Any, broker_url: str) -> Dict[str, Any]:
    """``fetch:a`` held with 3 runs parked (their copies in the broker), and a key of
    today's line, ``plain``, held."""
    parked_line(lock_client, "fetch:a", 3)
    park_copies(broker_url, "fetch:a", 3)
    assert isinstance(park_admit(lock_client, [SlotLimit("plain", 2, PREFIX)], lease=30,
                                 run=run_id("p", 0)), Lease)
    return {"app": views_app(redis_server, broker_url), "key": semaphore_key("fetch:a")}


def test_status_shows_the_parked_line_and_its_parking_queue(parked: Dict[str, Any]) -> None:
    result = invoke(parked["app"], "status", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert "parked" not in rows["plain"]  # a key of today's line: its row as ever
    row = rows["fetch:a"]
    assert (row["waiting"], row["used"], row["contended"]) == (3, 1, True)
    assert row["parked"] == {
        "waiting": 3, "references": 3, "anonymous": 0, "reserved": 0, "claimed": 0,
        "served": 0, "last_parked_age_seconds": row["parked"]["last_parked_age_seconds"],
        "oldest_age_seconds": None, "queue": parking_queue(parked["key"]),
        "queue_length": 3, "fair_sub_lines": 0}
    assert 0 <= row["parked"]["last_parked_age_seconds"] < 30

    text = invoke(parked["app"], "status", "--wide")
    lines = {line.split()[0]: line.split() for line in text.stdout.splitlines()}
    assert lines["NAME"][-2:] == ["PARKED", "SERVED"]
    assert lines["fetch:a"][4] == "3" and lines["fetch:a"][-2:] == ["3", "0"]
    assert lines["plain"][-2:] == ["-", "-"]


def test_inspect_and_watch_show_the_parked_line(parked: Dict[str, Any]) -> None:
    result = invoke(parked["app"], "inspect", "fetch:a", "--wide")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "1 live holder(s), 1/1 slots used, 3 waiting" in out
    assert ("parked line: 3 parked (3 reference(s), 0 anonymous), 0 reserved, 0 claimed, "
            "0 served kept") in out
    assert f"parking queue: {parking_queue(parked['key'])}, 3 message(s) in the broker" in out
    assert "oldest waiter's age: not kept by the lock store" in out
    data = json.loads(invoke(parked["app"], "inspect", "fetch:a", "--json").stdout)
    assert data["waiting"] == 3 and "waiters" not in data
    assert data["parked"]["queue_length"] == 3

    store = LockStore(parked["app"])
    states = [s for s in store.states(store.limit_keys(), store.now_ms()) if s.active]
    view = "\n".join(render(states, rows=3))
    assert re.search(r"fetch:a\s+1/1\s+3\s", view)
    assert "parked  3 parked (3 reference(s), 0 anonymous)" in view
    assert "in the broker: 3" in view


def test_without_the_broker_the_lock_stores_counts_are_shown(
        redis_server: Any, lock_client: Any, closed_port: int) -> None:
    parked_line(lock_client, "fetch:b", 2)
    app = views_app(redis_server, f"redis://127.0.0.1:{closed_port}/0")
    result = invoke(app, "status", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    assert (row["waiting"], row["parked"]["queue_length"]) == (2, None)
    assert "parking queues' lengths unknown (broker: " in result.stderr
    text = invoke(app, "inspect", "fetch:b").stdout
    assert "length unknown (broker not asked)" in text


def test_dashboard_json_has_the_parked_line(parked: Dict[str, Any]) -> None:
    dashboard = Dashboard(LockStore(parked["app"]), min_interval=0, history=5)
    state = dashboard.state()
    rows = {row["name"]: row for row in state["keys"]}
    row = rows["fetch:a"]
    assert row["waiting"] == 3 and row["parked"]["queue_length"] == 3
    assert row["parked"]["queue"] == parking_queue(parked["key"])
    assert row["history"][-1]["waiting"] == 3
    assert "parked" not in rows["plain"]
    assert state["totals"]["waiting"] == 3


def samples(collector: ParkedLinesCollector) -> Dict[str, Dict[str, float]]:
    found: Dict[str, Dict[str, float]] = {}
    for family in collector.collect():
        for sample in family.samples:
            found.setdefault(sample.name, {})[sample.labels.get("limit", "")] = sample.value
    return found


def test_prometheus_gauges_one_series_per_limit_label(parked: Dict[str, Any],
                                                     lock_client: Any) -> None:
    """Keys made by one template add up under its label; other names are within the
    label budget; the parking queues' lengths come from the broker."""
    parked_line(lock_client, "fetch:b", 2)
    for n in range(3):
        parked_line(lock_client, f"other-{n}", 1)
    found = samples(ParkedLinesCollector(parked["app"]))
    assert found["celery_redislock_parked_up"][""] == 1
    waiting = found["celery_redislock_parked_waiting"]
    assert waiting["fetch:{site}"] == 5
    assert set(waiting) == {"fetch:{site}", "other-0", "other-1", "other"}  # budget 3
    assert waiting["other"] == 1
    assert found["celery_redislock_parked_lines"]["fetch:{site}"] == 2
    assert found["celery_redislock_parked_queue_messages"]["fetch:{site}"] == 3
    assert found["celery_redislock_parked_reserved"]["fetch:{site}"] == 0
    assert found["celery_redislock_parked_fair_sub_lines"]["fetch:{site}"] == 0


def test_prometheus_gauge_of_the_fair_sub_lines_waiting(parked: Dict[str, Any],
                                                       lock_client: Any) -> None:
    """A fair limit's sub-lines waiting, added up under its label: a count only."""
    def send(tenant: str, task: str) -> Any:
        return park_admit(lock_client, [SlotLimit("fetch:f", 1, PREFIX, 1, tenant)],
                          lease=30, run=run_id(task, 0))

    assert isinstance(send("tenant:x", "holder"), Lease)
    for n in range(5):
        assert isinstance(send(f"tenant:{n % 3}", f"run-{n}"), Busy)
    found = samples(ParkedLinesCollector(parked["app"]))
    assert found["celery_redislock_parked_fair_sub_lines"]["fetch:{site}"] == 3
    assert found["celery_redislock_parked_waiting"]["fetch:{site}"] == 3 + 5


def test_prometheus_gauges_without_a_lock_store(redis_server: Any, closed_port: int) -> None:
    app = views_app(redis_server, f"redis://127.0.0.1:{closed_port}/0")
    app.conf.redislock_url = f"redis://127.0.0.1:{closed_port}/0"
    found = samples(ParkedLinesCollector(app))
    assert found == {"celery_redislock_parked_up": {"": 0}}


def test_a_parked_line_object_reads_in_words() -> None:
    line = ParkedLine("k", 10_000, references_waiting=2, anonymous=1, last_parked_ms=7_500)
    assert (line.waiting, line.last_parked_age, line.oldest_age) == (3, 2.5, None)


def test_the_page_shows_the_parked_line(parked: Dict[str, Any]) -> None:
    """In a real headless chromium: the key's row counts the parked runs, its details
    show the parked line and its parking queue."""
    from support import wait_until
    from web_support import click, dashboard_in_chromium, shown

    with dashboard_in_chromium(parked["app"]) as driver:
        click(driver, "css selector", f'tr.key-row[data-key="{parked["key"]}"]')
        wait_until(lambda: "Parked line (3)" in shown(driver, "tr.detail h3"), timeout=15,
                   interval=0.1, what="the parked line in the key's details")
        assert not any(h.startswith("Waiting line") for h in shown(driver, "tr.detail h3"))
        words = " ".join(shown(driver, "tr.detail .parked p"))
        assert "3 reference(s) waiting, 0 anonymous, 0 reserved, 0 claimed" in words
        assert f"Parking queue {parking_queue(parked['key'])}: 3 message(s)" in words


def test_the_page_shows_a_fair_limits_first_sub_lines(parked: Dict[str, Any],
                                                      lock_client: Any) -> None:
    """In a real headless chromium: a fair limit's details list its sub-lines waiting,
    first by turn, with their weights; the count says how many wait."""
    from support import wait_until
    from web_support import click, dashboard_in_chromium, shown

    limit = [SlotLimit("fetch:f", 1, PREFIX, 1, "tenant:x")]
    assert isinstance(park_admit(lock_client, limit, lease=30, run=run_id("h", 0)), Lease)
    for n in range(3):
        sub = [SlotLimit("fetch:f", 1, PREFIX, 1, f"tenant:{n}")]
        assert isinstance(park_admit(lock_client, sub, lease=30, run=run_id(f"f{n}", 0)), Busy)
    set_weight(lock_client, limit[0].key, "tenant:1", 2)
    with dashboard_in_chromium(parked["app"]) as driver:
        click(driver, "css selector", f'tr.key-row[data-key="{limit[0].key}"]')
        wait_until(lambda: "Fair sub-lines waiting (3)" in shown(driver, "tr.detail h3"),
                   timeout=15, interval=0.1, what="the fair sub-lines in the key's details")
        rows = shown(driver, "tr.detail .fair tbody tr")
        assert len(rows) == 3 and rows[0].startswith("tenant:0")
        assert any(row.startswith("tenant:1") and "2" in row for row in rows)


@pytest.mark.parametrize("line", ["broker", "store"])  # "store": retired, read as "broker"
def test_the_exporter_serves_the_parked_gauges(
        parked: Dict[str, Any], tmp_path: Path, line: str) -> None:
    import urllib.request

    from celery_redislock.metrics.prometheus import Exporter

    app = parked["app"]
    app.conf.redislock_line = line
    exporter = Exporter(app, (0,), "127.0.0.1")
    exporter.path = str(tmp_path)
    exporter.start()
    try:
        port = exporter.server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            page = reply.read().decode()
    finally:
        exporter.stop()
    assert 'celery_redislock_parked_waiting{limit="fetch:{site}"} 3.0' in page
    assert 'celery_redislock_parked_queue_messages{limit="fetch:{site}"} 3.0' in page
    assert "celery_redislock_parked_up 1.0" in page
