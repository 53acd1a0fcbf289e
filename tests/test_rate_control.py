"""Rates changed at run time: ``set-rate`` / ``clear-rate`` and ``control.set_rate``.

The override lives in the rate limiter's control hash and is read by the admission script
itself, so every worker's next admission uses it. The end-to-end test lowers a rate while
a real prefork worker starts tasks, and measures the start times recorded in the bodies.
"""

from __future__ import annotations

import json
from typing import Iterator, List

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock import RateLimiter
from celery_redislock.admin import control
from celery_redislock.admin.cli import redislock
from celery_redislock.config.settings import read_settings
from celery_redislock.engine.keys import rate_key
from celery_redislock.line.waiting import SHORT_WAIT

import features_app
from cli_app import CRAWL, create_app
from cluster_checks import lua_commands, record_store, wait_until
from features_app import RATED, RATED_KEY
from support import LOCK_DB
from worker_cluster import WorkerCluster


@pytest.fixture
def app(redis_server, lock_client):
    return create_app(f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}")


def invoke(app, *args):
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
    return CliRunner().invoke(redislock, list(args), obj=obj)


def test_set_rate_paces_the_engine_limiter_at_once(lock_client) -> None:
    """1/s with no burst; overridden to 1/m, what is still owed of the second is rescaled
    to minutes, so the next start is refused. (The owed time is the interval's rest when
    the override is read: with a base of 1 s, a loaded machine's pause between the two
    calls does not use it up, as it could a base of 100 ms.)"""
    limiter = RateLimiter(lock_client, "partner", rate="1/s", burst=0)
    assert limiter.try_acquire()
    control.set_rate(lock_client, "partner", "1/m")
    wait = limiter.try_acquire()
    assert not wait
    state = lock_client.hgetall(rate_key("partner").replace("}:r:", "}:cr:"))
    assert state[b"rate"] == b"1/m" and float(state[b"interval"]) == 60e6
    assert control.clear_rate(lock_client, "partner")
    assert not control.clear_rate(lock_client, "partner")


def test_bad_rate_is_refused(lock_client) -> None:
    with pytest.raises(control.LimitControlError, match="not a rate"):
        control.set_rate(lock_client, "partner", "fast")
    with pytest.raises(control.LimitControlError, match="above zero"):
        control.set_rate(lock_client, "partner", "0/s")


def test_cli_set_rate_shows_in_status_and_clears(app) -> None:
    result = invoke(app, "set-rate", CRAWL, "100/m")
    assert result.exit_code == 0, result.output
    assert "rate set to 100/m" in result.output
    rows = {row["name"]: row for row in json.loads(invoke(app, "status", "--json").output)}
    assert rows[CRAWL]["rate_override"] == "100/m"
    assert "100/m (set-rate)" in invoke(app, "status").output
    assert control.limit_state(app, CRAWL).rate_override == "100/m"
    result = invoke(app, "clear-rate", CRAWL)
    assert result.exit_code == 0 and "rate override cleared" in result.output
    assert control.limit_state(app, CRAWL).rate_override is None
    bad = invoke(app, "set-rate", CRAWL, "lots")
    assert bad.exit_code != 0 and "not a rate" in bad.output


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path_factory.mktemp("rate-workers"), app_module="features_app",
                       app_factory=features_app.create_app, workers=2,
                       concurrency=2) as started:
        yield started


def _starts(record) -> List[float]:
    return sorted(int(value) / 1e6 for value in record.hvals("started"))


#: The queue ``test_rate_lowered_at_run_time_slows_starts_on_every_worker`` fills before
#: the workers consume it, so that its backlog is whole when the first run starts.
BACKLOG = "rated-backlog"


@pytest.mark.slow
def test_rate_lowered_at_run_time_slows_starts_on_every_worker(cluster: WorkerCluster) -> None:
    """A backlog runs at 20/s (no burst) on two workers; set_rate lowers it to 4/s: the
    starts after the change (a second allowed for runs admitted just before, and starts
    booked before it, at most half a second ahead, keep their time) are spaced at least
    ~250 ms apart, whichever worker runs them. The spacing is judged by the
    admissions (server clock), as the limit decides them: a body records its start after
    its run was handed to a pool process, later by however long that took.

    The backlog is sent to a queue no worker consumes yet, and the workers are told to
    consume it once it is whole: sent while they consume (30 sends took 1.3 s at load
    ~16, as long as 26 starts at 20/s), most of it ran before the change."""
    task = cluster.app.tasks[RATED]
    record = record_store(cluster)
    for _ in range(40):
        task.apply_async(queue=BACKLOG)
    replies = cluster.app.control.add_consumer(BACKLOG, reply=True, timeout=20, limit=2)
    assert len(replies) == 2, replies
    wait_until(lambda: record.hlen("started") >= 8, 30, "8 starts at 20/s")
    control.set_rate(cluster.app, RATED_KEY, "4/s")
    seconds, micros = cluster.redis.client().time()
    changed_at = seconds + micros / 1e6
    started_then = record.hlen("started")
    wait_until(lambda: len([t for t in _starts(record) if t > changed_at + 1]) >= 7, 30,
               f"7 starts at the new rate ({started_then} of 40 started at the change)")
    starts = _starts(record)
    before = [t for t in starts if t < changed_at]
    slow = [t for t in starts if t > changed_at + 1]
    admitted = _admissions(record)
    slow_admitted = [t for t in admitted if t > changed_at + 1]
    gaps = [b - a for a, b in zip(slow_admitted, slow_admitted[1:])]
    hosts = {record.get(f"host:{task_id}") for task_id in record.hkeys("started")}
    print(f"\nstarts/s before {(len(before) - 1) / (before[-1] - before[0]):.1f}, "
          f"after lowering to 4/s {(len(slow) - 1) / (slow[-1] - slow[0]):.2f}; smallest gap "
          f"after {min(gaps) * 1000:.0f} ms; workers {len(hosts)}; {started_then} of 40 started at "
          "the change")
    assert min(b - a for a, b in zip(before, before[1:])) < 0.15  # faster than 4/s before
    assert len(slow_admitted) >= 2, admitted
    assert min(gaps) > 0.2, gaps  # 250 ms apart
    assert (len(slow) - 1) / (slow[-1] - slow[0]) < 4.5
    # And in no second that began after the starts booked before the change (at most
    # SHORT_WAIT ahead, see gate.py) were more than 4 runs admitted (no burst).
    after = [t for t in admitted if t >= changed_at + SHORT_WAIT]
    assert most_in_any_window(after, 1.0) <= 4, after
    control.clear_rate(cluster.app, RATED_KEY)


def _admissions(record) -> List[float]:
    return sorted(int(value) / 1e3 for value in record.hvals("admitted"))


def most_in_any_window(times: List[float], window: float) -> int:
    """The largest number of ``times`` (sorted, seconds) inside any half-open window."""
    most, first = 0, 0
    for last, moment in enumerate(times):
        while moment - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.slow
def test_a_fast_backlog_books_its_starts_one_call_per_run(cluster: WorkerCluster) -> None:
    """30 runs at once at 100/s (set at run time; no burst) on two workers of two
    processes: each worker's main process books the start of each run it holds (all
    within half a second) in the call that would only have promised it, and hands the
    run to the pool when it comes, without asking again. So the backlog costs about one
    admission call per run (a promise and an admission each before), each run is
    admitted once, and no two admissions are closer than the rate's interval (judged
    on the server's clock, as the limit decides them)."""
    task = cluster.app.tasks[RATED]
    record = record_store(cluster)
    control.set_rate(cluster.app, RATED_KEY, "100/s")
    key = rate_key(RATED_KEY, read_settings(cluster.app).prefix)
    with lua_commands(cluster) as commands:
        ids = [task.delay().id for _ in range(30)]
        wait_until(lambda: record.hlen("admitted") >= 30, 30, "every run admitted")
    asked = [words for words in commands if words[:2] == ["HMGET", key]]
    admitted = _admissions(record)
    gaps = [round((b - a) * 1000) for a, b in zip(admitted, admitted[1:])]
    print(f"\n{len(asked)} admission calls for 30 runs; smallest gap {min(gaps)} ms")
    assert sorted(record.hkeys("admitted")) == sorted(ids)
    assert min(gaps) >= 9, gaps  # 10 ms apart, to the millisecond the record keeps
    assert len(asked) <= 1.4 * len(ids), asked
    control.clear_rate(cluster.app, RATED_KEY)
