"""``celery redislock ...``: status, inspect, release and reap, on a real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock import Semaphore
from celery_redislock.admission import SlotLimit, admit
from celery_redislock.cli import redislock
from celery_redislock.keys import semaphore_key
from celery_redislock.scripts import HOLDERS
from celery_redislock.testing import free_port

from cli_app import CRAWL, URL_ENV, create_app
from support import LOCK_DB

TESTS = Path(__file__).resolve().parent
DESCRIPTION = '{"task": "proj.t", "worker": "w1@host", "pid": 123, "id": "task-1"}'
STATUS_FIELDS = {"key", "name", "holders", "reserved", "used", "limit", "configured_limit",
                 "slots_override", "waiting", "paused", "paused_until", "pause_left_seconds",
                 "contended", "oldest_age_seconds"}
INSPECT_FIELDS = {"key", "name", "used", "limit", "configured_limit", "slots_override",
                  "paused", "paused_until", "pause_left_seconds", "holders", "reservations",
                  "waiting", "waiters"}


def cli_runner() -> CliRunner:
    """A runner that keeps stderr apart (click before 8.2 needs asking)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click 8.2+: always apart, and the argument is gone
        return CliRunner()


@pytest.fixture
def lock_url(redis_server, lock_client):
    return f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}"


@pytest.fixture
def app(lock_url):
    return create_app(lock_url)


def invoke(app, *args):
    """Run ``celery redislock <args>`` in-process, with Celery's CLI context."""
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
    return cli_runner().invoke(redislock, list(args), obj=obj)


@pytest.fixture
def holders(lock_client):
    """Two holders of the task's semaphore (one a task run with a description), and a
    contended semaphore "other" (one slot, one holder, one refusal)."""
    plain = Semaphore(lock_client, CRAWL, slots=2).acquire()
    run = admit(lock_client, [SlotLimit(CRAWL, 2, "redislock:")], lease=30,
                owner="w1@host|task-1|", description=DESCRIPTION)
    other = Semaphore(lock_client, "other", slots=1)
    other_lease = other.acquire()
    assert plain is not None and run.fence and other_lease is not None
    assert other.acquire() is None  # refused: "other" is now contended
    return {"plain": plain, "run": run, "other": other_lease}


def live_holders(client, name):
    return int(HOLDERS.run(client, [semaphore_key(name)], []))


def assert_clean_failure(result):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
    assert len(result.stderr.strip().splitlines()) == 1


def test_status_json_follows_the_documented_schema(app, holders):
    result = invoke(app, "status", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {CRAWL, "other"}
    for row in rows.values():
        assert set(row) == STATUS_FIELDS
        assert isinstance(row["holders"], int) and isinstance(row["contended"], bool)
        assert isinstance(row["oldest_age_seconds"], float) and row["oldest_age_seconds"] >= 0
        assert isinstance(row["waiting"], int) and isinstance(row["paused"], bool)
    crawl = rows[CRAWL]
    assert crawl["key"] == semaphore_key(CRAWL)
    assert (crawl["holders"], crawl["used"], crawl["limit"], crawl["contended"]) == (
        2, 2, 2, False)
    assert (crawl["waiting"], crawl["paused"], crawl["paused_until"]) == (0, False, None)
    assert (crawl["configured_limit"], crawl["slots_override"], crawl["reserved"]) == (
        2, None, 0)
    other = rows["other"]
    # "other" is not a task's key: its limit is the one its admissions recorded
    assert (other["holders"], other["limit"], other["contended"]) == (1, 1, True)


def test_status_text_shows_used_over_limit(app, holders):
    result = invoke(app, "status")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert lines["NAME"] == ["NAME", "USED", "CONFIGURED", "OVERRIDE", "WAITING", "PAUSED",
                             "CONTENDED", "OLDEST"]
    assert lines[CRAWL][1:7] == ["2/2", "2", "-", "0", "no", "no"]
    assert lines["other"][1:7] == ["1/1", "1", "-", "0", "no", "yes"]


def test_status_without_semaphores(app, lock_client):
    assert invoke(app, "status").stdout.strip() == "no semaphores"
    assert json.loads(invoke(app, "status", "--json").stdout) == []


def test_status_counts_only_live_holders(app, holders, lock_client):
    add_expired_holder(lock_client, CRAWL)
    rows = {row["name"]: row for row in json.loads(invoke(app, "status", "--json").stdout)}
    assert rows[CRAWL]["holders"] == 2


def test_status_help_documents_the_schema(app):
    result = invoke(app, "status", "--help")
    assert '"oldest_age_seconds": float or null' in result.stdout
    assert '"waiting": int, "paused": bool' in result.stdout


def test_inspect_json_lists_holders(app, holders, lock_client):
    result = invoke(app, "inspect", CRAWL, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == INSPECT_FIELDS
    assert data["key"] == semaphore_key(CRAWL) and data["name"] == CRAWL
    assert (data["used"], data["limit"], data["waiting"], data["waiters"]) == (2, 2, 0, [])
    by_token = {holder["token"]: holder for holder in data["holders"]}
    assert set(by_token) == {holders["plain"].token, holders["run"].token}
    run = by_token[holders["run"].token]
    assert run["token"].startswith("w1@host|task-1|")
    assert (run["task_id"], run["task"], run["worker"], run["pid"]) == (
        "task-1", "proj.t", "w1@host", 123)
    assert run["fence"] == holders["run"].fence
    assert 0 <= run["age_seconds"] < 30 and 0 < run["lease_left_seconds"] <= 30
    assert run["expired"] is False
    plain = by_token[holders["plain"].token]
    assert (plain["task_id"], plain["task"], plain["worker"], plain["pid"]) == (
        None, None, None, None)
    assert plain["fence"] == holders["plain"].fence


def test_inspect_text_shows_each_holder(app, holders, lock_client):
    add_expired_holder(lock_client, CRAWL)
    result = invoke(app, "inspect", CRAWL)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith(f"{CRAWL} (")
    assert "2 live holder(s)" in result.stdout
    run_line = next(line for line in result.stdout.splitlines()
                    if line.startswith(holders["run"].token))
    assert run_line.split()[1:5] == ["task-1", "proj.t", "w1@host", "123"]
    assert run_line.split()[-1] == str(holders["run"].fence)
    assert "expired" in next(line for line in result.stdout.splitlines()
                             if line.startswith("dead|"))


def test_inspect_accepts_the_full_key(app, holders):
    result = invoke(app, "inspect", semaphore_key("other"), "--json")
    assert result.exit_code == 0, result.output
    assert [h["token"] for h in json.loads(result.stdout)["holders"]] == [
        holders["other"].token]


def test_inspect_unknown_name_fails_cleanly(app, holders):
    result = invoke(app, "inspect", "no-such-semaphore")
    assert_clean_failure(result)
    assert "no limit named 'no-such-semaphore'" in result.stderr


def test_release_frees_one_holder_by_token_prefix(app, holders, lock_client):
    result = invoke(app, "release", CRAWL, "w1@host|task-1|")
    assert result.exit_code == 0, result.output
    assert f"freed holder {holders['run'].token} of {CRAWL}" in result.stdout
    assert "task proj.t" in result.stdout and "worker w1@host" in result.stdout
    assert live_holders(lock_client, CRAWL) == 1
    assert holders["run"].release() is False  # its slot is already gone
    assert holders["plain"].release() is True  # the other holder was left alone


def test_release_by_full_token(app, holders, lock_client):
    result = invoke(app, "release", "other", holders["other"].token)
    assert result.exit_code == 0, result.output
    assert live_holders(lock_client, "other") == 0
    assert Semaphore(lock_client, "other", slots=1).acquire() is not None


def test_release_unknown_holder_fails_cleanly(app, holders, lock_client):
    result = invoke(app, "release", CRAWL, "nobody|")
    assert_clean_failure(result)
    assert "has no holder 'nobody|'" in result.stderr
    assert live_holders(lock_client, CRAWL) == 2


def test_release_ambiguous_holder_fails_cleanly(app, lock_client):
    pair = Semaphore(lock_client, "pair", slots=2)
    first, second = pair.acquire(), pair.acquire()
    common = first.token.split(".")[0] + "."  # this process's part of every token
    assert second.token.startswith(common)
    result = invoke(app, "release", "pair", common)
    assert_clean_failure(result)
    assert "ambiguous" in result.stderr
    assert live_holders(lock_client, "pair") == 2


def test_release_on_unknown_name_fails_cleanly(app, holders):
    assert_clean_failure(invoke(app, "release", "no-such-semaphore", "x"))


def add_expired_holder(client, name):
    """Write a holder entry whose lease ended a second ago (server clock)."""
    seconds, microseconds = client.time()
    now = seconds * 1000 + microseconds // 1000
    client.zadd(semaphore_key(name), {f"dead|t-0|x {now - 31000} 5 ": now - 1000})


def test_reap_drops_only_expired_entries(app, holders, lock_client):
    add_expired_holder(lock_client, CRAWL)
    add_expired_holder(lock_client, "other")
    key = semaphore_key("other")
    statistics = {m: lock_client.zscore(key, m) for m in (b"#fence", b"#hold")}
    assert all(score is not None and score < 0 for score in statistics.values())
    result = invoke(app, "reap")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "reaped 2 expired holder entries"
    assert live_holders(lock_client, CRAWL) == 2 and live_holders(lock_client, "other") == 1
    assert lock_client.zcard(semaphore_key(CRAWL)) == 4  # 2 holders, '#fence', '#slots'
    assert {m: lock_client.zscore(key, m) for m in statistics} == statistics
    assert lock_client.zscore(key, "#slots") == -1
    assert invoke(app, "reap").stdout.strip() == "reaped 0 expired holder entries"


@pytest.mark.parametrize("args", [
    ["status"], ["status", "--json"], ["inspect", CRAWL], ["release", CRAWL, "x"], ["reap"],
])
def test_unreachable_redis_fails_cleanly(args):
    app = create_app(f"redis://127.0.0.1:{free_port()}/0")
    result = invoke(app, *args)
    assert_clean_failure(result)
    assert "lock store Redis failed" in result.stderr


def test_broken_settings_fail_cleanly():
    app = create_app("http://not-redis")
    result = invoke(app, "status")
    assert_clean_failure(result)
    assert "redislock_url" in result.stderr


def run_celery(url, *args):
    """Run the real ``celery -A cli_app redislock <args>`` command."""
    env = {**os.environ, URL_ENV: url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "cli_app", "redislock", *args],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=120,
    )


def test_celery_command_runs_the_entry_point(lock_url, holders):
    result = run_celery(lock_url, "status", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert set(rows[CRAWL]) == STATUS_FIELDS
    assert (rows[CRAWL]["holders"], rows[CRAWL]["limit"]) == (2, 2)
    assert (rows["other"]["holders"], rows["other"]["limit"]) == (1, 1)


def test_celery_command_fails_cleanly_without_redis():
    result = run_celery(f"redis://127.0.0.1:{free_port()}/0", "status", "--json")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "lock store Redis failed" in result.stderr
