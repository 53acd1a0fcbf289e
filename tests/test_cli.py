"""``celery redislock ...``: status, inspect, release and reap, on a real redis-server."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock import LimitedTask, Semaphore
from celery_redislock.admin.cli import LockStore, redislock
from celery_redislock.admin.control import limit_state
from celery_redislock.engine.admission import Busy, Lease, Paused, SlotLimit, admit
from celery_redislock.engine.keys import semaphore_key
from celery_redislock.engine.scripts import HOLDERS

from cli_app import CRAWL, URL_ENV, create_app
from support import LOCK_DB

TESTS = Path(__file__).resolve().parent
DESCRIPTION = '{"task": "proj.t", "worker": "w1@host", "pid": 123, "id": "task-1"}'
STATUS_FIELDS = {"key", "name", "holders", "reserved", "used", "limit", "configured_limit",
                 "slots_override", "waiting", "paused", "paused_until", "pause_left_seconds",
                 "contended", "oldest_age_seconds", "rate_limiter", "rate",
                 "rate_override"}
INSPECT_FIELDS = {"key", "name", "used", "limit", "configured_limit", "slots_override",
                  "paused", "paused_until", "pause_left_seconds", "rate", "rate_override",
                  "holders", "reservations", "waiting"}


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
    plain = Semaphore(lock_client, CRAWL, slots=2).acquire(blocking=False)
    run = admit(lock_client, [SlotLimit(CRAWL, 2, "redislock:")], lease=30,
                owner="w1@host|task-1|", description=DESCRIPTION)
    other = Semaphore(lock_client, "other", slots=1)
    other_lease = other.acquire(blocking=False)
    assert plain is not None and run.fence and other_lease is not None
    assert other.acquire(blocking=False) is None  # refused: "other" is now contended
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
    result = invoke(app, "status", "--wide")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert lines["NAME"] == ["NAME", "USED", "CONFIGURED", "OVERRIDE", "WAITING", "PAUSED",
                             "CONTENDED", "OLDEST", "RATE"]
    assert lines[CRAWL][1:7] == ["2/2", "2", "-", "0", "no", "no"]
    assert lines["other"][1:7] == ["1/1", "1", "-", "0", "no", "yes"]


def test_status_without_semaphores(app, lock_client):
    assert invoke(app, "status").stdout.strip() == "no limits in the lock store"
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
    assert (data["used"], data["limit"], data["waiting"]) == (2, 2, 0)
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
    assert result.stdout.splitlines()[0].startswith(f"{CRAWL}: 2 live holder(s)")
    result = invoke(app, "inspect", CRAWL, "--wide")
    run_line = next(line for line in result.stdout.splitlines()
                    if line.startswith(holders["run"].token))
    assert run_line.split()[1:5] == ["task-1", "proj.t", "w1@host", "123"]
    assert run_line.split()[7] == str(holders["run"].fence)
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
    assert Semaphore(lock_client, "other", slots=1).acquire(blocking=False) is not None


def test_release_unknown_holder_fails_cleanly(app, holders, lock_client):
    result = invoke(app, "release", CRAWL, "nobody|")
    assert_clean_failure(result)
    assert "has no holder 'nobody|'" in result.stderr
    assert live_holders(lock_client, CRAWL) == 2


def test_release_ambiguous_holder_fails_cleanly(app, lock_client):
    pair = Semaphore(lock_client, "pair", slots=2)
    first, second = pair.acquire(blocking=False), pair.acquire(blocking=False)
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
    assert lock_client.zcard(semaphore_key(CRAWL)) == 5  # 2 holders, '#fence', '#slots', '#ttl'
    assert {m: lock_client.zscore(key, m) for m in statistics} == statistics
    assert lock_client.zscore(key, "#slots") == -1
    assert invoke(app, "reap").stdout.strip() == "reaped 0 expired holder entries"


@pytest.mark.parametrize("args", [
    ["status"], ["status", "--json"], ["inspect", CRAWL], ["release", CRAWL, "x"], ["reap"],
    ["set-slots", CRAWL, "3"], ["clear-slots", CRAWL], ["pause", CRAWL, "--for", "5s"],
    ["resume", CRAWL], ["watch", "--once"],
])
def test_unreachable_redis_fails_cleanly(args, closed_port):
    app = create_app(f"redis://127.0.0.1:{closed_port}/0")
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


def test_celery_command_pauses_and_resumes(lock_url, holders, lock_client):
    result = run_celery(lock_url, "pause", CRAWL, "--for", "30s")
    assert result.returncode == 0, result.stderr
    assert isinstance(Semaphore(lock_client, CRAWL, slots=3).attempt(), Paused)
    result = run_celery(lock_url, "resume", CRAWL)
    assert (result.returncode, result.stdout.strip()) == (0, f"{CRAWL}: resumed")
    result = run_celery(lock_url, "set-slots", CRAWL, "zero")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "Error: expected a whole number, not 'zero'"


def test_celery_command_fails_cleanly_without_redis(closed_port):
    result = run_celery(f"redis://127.0.0.1:{closed_port}/0", "status", "--json")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "lock store Redis failed" in result.stderr


# --- set-slots / clear-slots ---------------------------------------------------------


def status_of(app, name):
    result = invoke(app, "status", "--json")
    assert result.exit_code == 0, result.output
    return {row["name"]: row for row in json.loads(result.stdout)}[name]


def test_set_slots_raises_and_lowers_the_limit(app, holders, lock_client):
    crawl = Semaphore(lock_client, CRAWL, slots=2)
    assert crawl.attempt().__class__.__name__ == "Busy"
    result = invoke(app, "set-slots", CRAWL, "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{CRAWL}: slots set to 3 (configured 2), 2 in use"
    third = crawl.attempt()
    assert isinstance(third, Lease)
    row = status_of(app, CRAWL)
    assert (row["used"], row["limit"], row["configured_limit"], row["slots_override"]) == (
        3, 3, 2, 3)
    # Lowering below the holders evicts nobody: they drain.
    assert invoke(app, "set-slots", CRAWL, "1").exit_code == 0
    assert live_holders(lock_client, CRAWL) == 3 and third.renew()
    assert isinstance(crawl.attempt(), Busy)
    assert third.release() and holders["plain"].release()
    assert isinstance(crawl.attempt(), Busy)  # one holder left = the limit of 1
    text_row = next(line.split() for line in invoke(app, "status", "--wide").stdout.splitlines()
                    if line.startswith(CRAWL))
    assert text_row[1:4] == ["1/1", "2", "1"]


def test_clear_slots_restores_the_configured_limit(app, holders, lock_client):
    crawl = Semaphore(lock_client, CRAWL, slots=2)
    assert invoke(app, "set-slots", CRAWL, "3").exit_code == 0
    extra = crawl.attempt()
    assert isinstance(extra, Lease)
    result = invoke(app, "clear-slots", CRAWL)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{CRAWL}: slot override cleared"
    row = status_of(app, CRAWL)
    assert (row["used"], row["limit"], row["slots_override"]) == (3, 2, None)
    assert isinstance(crawl.attempt(), Busy)
    assert extra.release()
    assert isinstance(crawl.attempt(), Busy)  # 2 of 2 again
    assert invoke(app, "clear-slots", CRAWL).stdout.strip() == f"{CRAWL}: had no slot override"


@pytest.mark.parametrize(("count", "message"), [
    ("0", "slots of 'cli_app.crawl' must be >= 1, not 0"),
    ("-2", "slots of 'cli_app.crawl' must be >= 1, not -2"),
    ("many", "expected a whole number, not 'many'"),
    ("1.5", "expected a whole number, not '1.5'"),
])
def test_set_slots_bad_number_fails_cleanly(app, holders, lock_client, count, message):
    result = invoke(app, "set-slots", CRAWL, count)
    assert_clean_failure(result)
    assert message in result.stderr
    assert status_of(app, CRAWL)["slots_override"] is None


def test_set_slots_unknown_name_fails_unless_forced(app, lock_client):
    result = invoke(app, "set-slots", "no-such-key", "4")
    assert_clean_failure(result)
    assert "no limit named 'no-such-key'" in result.stderr
    assert invoke(app, "set-slots", "no-such-key", "4", "--force").exit_code == 0
    assert Semaphore(lock_client, "no-such-key", slots=1).attempt().__class__ is Lease
    assert Semaphore(lock_client, "no-such-key", slots=1).attempt().__class__ is Lease


def test_set_slots_on_a_registered_task_key_before_any_run(app, lock_client):
    result = invoke(app, "set-slots", CRAWL, "5")  # nothing in Redis yet: the task's key
    assert result.exit_code == 0, result.output
    assert "slots set to 5 (configured 2)" in result.stdout  # the task's lock_slots


# --- pause / resume ------------------------------------------------------------------


def server_seconds(client):
    seconds, microseconds = client.time()
    return seconds + microseconds / 1e6


def test_pause_for_then_resume(app, holders, lock_client):
    crawl = Semaphore(lock_client, CRAWL, slots=3)
    before = server_seconds(lock_client)
    result = invoke(app, "pause", CRAWL, "--for", "30s")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{CRAWL}: paused until 20")
    row = status_of(app, CRAWL)
    end = row["paused_until"]
    assert before + 30 - 0.001 <= end <= server_seconds(lock_client) + 30
    # Every count-down is on the server's clock: from the end, less the server time after
    # the call however long a loaded machine took to get there, and never above 30 s.
    assert row["paused"] is True and 0 < row["pause_left_seconds"] <= 30
    assert row["pause_left_seconds"] >= end - server_seconds(lock_client) - 0.001
    refused = crawl.attempt()
    assert isinstance(refused, Paused)
    assert end - server_seconds(lock_client) - 0.001 <= refused.retry_hint <= 30
    assert holders["run"].renew()  # holders keep running
    status_line = next(line for line in invoke(app, "status", "--wide").stdout.splitlines()
                       if line.startswith(CRAWL))
    # the end of the pause as a time of day (UTC, server clock) and how far off it is
    found = re.search(r" until \d\d:\d\d:\d\dZ, in (\d+) s ", status_line)
    assert found, status_line
    assert end - server_seconds(lock_client) - 1 <= int(found.group(1)) <= 30
    result = invoke(app, "resume", CRAWL)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{CRAWL}: resumed"
    assert isinstance(crawl.attempt(), Lease)
    assert invoke(app, "resume", CRAWL).stdout.strip() == f"{CRAWL}: was not paused"


def test_pause_without_an_end(app, holders, lock_client):
    result = invoke(app, "pause", "other")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "other: paused until resumed"
    refused = Semaphore(lock_client, "other", slots=2).attempt()
    assert isinstance(refused, Paused) and refused.retry_hint is None
    row = status_of(app, "other")
    assert (row["paused"], row["paused_until"], row["pause_left_seconds"]) == (True, None, None)
    assert "forever" in next(line for line in invoke(app, "status").stdout.splitlines()
                             if line.startswith("other"))
    inspected = invoke(app, "inspect", "other")
    assert "paused until resumed" in inspected.stdout


@pytest.mark.parametrize("form", ["iso", "iso-offset", "unix"])
def test_pause_until_a_time(app, holders, lock_client, form):
    end = server_seconds(lock_client) + 60
    moment = datetime.datetime.fromtimestamp(end, tz=datetime.timezone.utc)
    value = {"iso": moment.isoformat().replace("+00:00", "Z"),
             "iso-offset": moment.astimezone(
                 datetime.timezone(datetime.timedelta(hours=2))).isoformat(),
             "unix": f"{end:.3f}"}[form]
    result = invoke(app, "pause", CRAWL, "--until", value)
    assert result.exit_code == 0, result.output
    assert status_of(app, CRAWL)["paused_until"] == pytest.approx(end, abs=0.002)
    assert isinstance(Semaphore(lock_client, CRAWL, slots=3).attempt(), Paused)


def test_pause_keep_longer(app, holders):
    assert invoke(app, "pause", CRAWL, "--for", "1h").exit_code == 0
    first = status_of(app, CRAWL)["paused_until"]
    assert invoke(app, "pause", CRAWL, "--for", "5s", "--keep-longer").exit_code == 0
    assert status_of(app, CRAWL)["paused_until"] == first
    assert invoke(app, "pause", CRAWL, "--for", "5s").exit_code == 0
    assert status_of(app, CRAWL)["paused_until"] < first


@pytest.mark.parametrize(("args", "message"), [
    (["--for", "0s"], "--for must be a length of time > 0"),
    (["--for", "soon"], "--for must be a length of time > 0"),
    (["--for", "5"], "--for needs a unit: 5s, 5m, 5h or 5d"),
    (["--until", "next tuesday"], "--until must be ISO-8601"),
    (["--until", "1000"], "is not after the lock store's time now"),
    (["--until", "2001-01-01T00:00:00Z"], "is not after the lock store's time now"),
    (["--until", "4000000000", "--for", "5s"], "give --until or --for, not both"),
])
def test_pause_bad_input_fails_cleanly(app, holders, args, message):
    result = invoke(app, "pause", CRAWL, *args)
    assert_clean_failure(result)
    assert message in result.stderr
    assert status_of(app, CRAWL)["paused"] is False


@pytest.mark.parametrize("command", [["pause"], ["resume"], ["clear-slots"], ["inspect"]])
def test_unknown_name_fails_cleanly(app, holders, command):
    result = invoke(app, *command, "no-such-key")
    assert_clean_failure(result)
    assert "no limit named 'no-such-key'" in result.stderr


def test_a_name_a_key_template_makes_is_known_before_any_run(app, lock_client):
    """``api:{token}`` makes ``api:999``: pausing it needs no ``--force``; a name no
    template makes is refused with a pointer to ``--force``."""
    @app.task(base=LimitedTask, lock_slots=1, lock_key="api:{token}", shared=False,
              name="cli_app.call_api")
    def call_api(token, payload=None):
        return None

    result = invoke(app, "pause", "api:999", "--for", "2s")
    assert result.exit_code == 0, result.stderr
    assert status_of(app, "api:999")["paused"] is True
    assert invoke(app, "resume", "api:999").exit_code == 0
    refused = invoke(app, "pause", "api:9:9", "--for", "2s")
    assert_clean_failure(refused)
    assert "no registered task's lock_key makes it" in refused.stderr
    assert "--force" in refused.stderr


def test_a_paused_rate_only_name_is_listed(app, lock_client):
    assert invoke(app, "pause", "partner", "--for", "60s", "--force").exit_code == 0
    row = status_of(app, "partner")
    assert (row["paused"], row["used"], row["limit"]) == (True, 0, None)
    assert invoke(app, "resume", "partner").exit_code == 0
    assert "partner" not in {r["name"] for r in json.loads(invoke(app, "status",
                                                                  "--json").stdout)}


# --- watch ---------------------------------------------------------------------------


def test_watch_once_shows_keys_and_holders(app, holders, lock_client):
    invoke(app, "pause", "other", "--for", "60s")
    invoke(app, "set-slots", CRAWL, "4")
    result = invoke(app, "watch", "--once", "--wide")
    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.stdout  # no terminal: no escape codes
    lines = result.stdout.splitlines()
    assert lines[0].startswith("celery-redislock: 2 key(s) at ")
    assert lines[1].split() == ["NAME", "USED", "WAITING", "PAUSED", "OVERRIDE", "RATE"]
    crawl_line = next(line.split() for line in lines if line.startswith(CRAWL))
    assert crawl_line[1:3] == ["2/4", "0"] and crawl_line[4] == "4"
    other_line = next(line.split() for line in lines if line.startswith("other"))
    assert other_line[1] == "1/1"
    assert re.search(r" until \d\d:\d\d:\d\dZ, in (59|60) s ", " ".join(other_line) + " ")
    assert any(line.strip().startswith("holds   proj.t task-1 on w1@host") for line in lines)


def test_watch_repeats_until_interrupted(app, holders):
    """Without --once it refreshes every --interval until Ctrl-C (here: the 3rd view)."""
    import celery_redislock.admin.watch as watch_module

    views = []
    real_render = watch_module.render

    def counting_render(*args, **kwargs):
        views.append(1)
        if len(views) == 3:
            raise KeyboardInterrupt
        return real_render(*args, **kwargs)

    watch_module.render = counting_render
    try:
        result = invoke(app, "watch", "--interval", "0.01")
    finally:
        watch_module.render = real_render
    assert result.exit_code == 0, result.output
    assert result.stdout.count("celery-redislock: 2 key(s)") == 2
    assert "every 0.01s, Ctrl-C to quit" in result.stdout


def test_watch_on_a_terminal_redraws_in_place(app, holders):
    from io import StringIO

    from celery_redislock.admin.cli import LockStore
    from celery_redislock.admin.watch import CLEAR, run_watch

    store = LockStore(app)
    screen = StringIO()
    run_watch(lambda: store.states(store.limit_keys(), store.now_ms()), once=True,
              stream=screen, is_tty=True)
    assert screen.getvalue().startswith(CLEAR)
    assert CRAWL in screen.getvalue()


@pytest.mark.parametrize(("args", "message"), [
    (["--interval", "0"], "--interval must be a number of seconds > 0"),
    (["--interval", "fast"], "--interval must be a number of seconds > 0"),
    (["--rows", "x"], "expected a whole number, not 'x'"),
])
def test_watch_bad_input_fails_cleanly(app, args, message):
    result = invoke(app, "watch", "--once", *args)
    assert_clean_failure(result)
    assert message in result.stderr


# --- one truth about slots and rates; rows sorted and within the terminal -----------


def shared_prefix_app(url):
    """Two templates that can make the same name: ``api:{token}`` with a rate and no
    slots, ``api:{token:hash}`` with slots and no rate; and a key with both."""
    from celery import Celery

    from celery_redislock import LimitedTask

    app = Celery("shared", set_as_current=False)
    app.conf.redislock_url = url

    @app.task(base=LimitedTask, lock_rate="10/s", lock_key="api:{token}",
              name="shared.call", shared=False)
    def call(token):
        return token

    @app.task(base=LimitedTask, lock_slots=2, lock_key="api:{token:hash}",
              name="shared.fetch", shared=False)
    def fetch(token):
        return token

    @app.task(base=LimitedTask, lock_slots=1, lock_rate="30/m",
              lock_key="partner:{partner}", name="shared.sync", shared=False)
    def sync(partner):
        return partner

    return app


def started(client, limiters, task, task_id, args=None):
    description = json.dumps({"task": task, "worker": "w1@host", "pid": 1, "id": task_id,
                              **({} if args is None else {"args": args})})
    run = admit(client, limiters, lease=30, owner=f"w1@host|{task_id}|",
                description=description)
    assert isinstance(run, Lease), run
    return run


@pytest.fixture
def shared(lock_url, lock_client):
    """``shared.fetch`` holding a slot of ``api:<digest>``, a start of ``shared.call`` on
    ``api:t1`` (a rate alone), ``shared.sync`` holding ``partner:acme`` (slots and rate)."""
    from celery_redislock.engine.admission import RateLimit
    from celery_redislock.engine.key_template import value_digest
    from celery_redislock.engine.rate import Rate

    app = shared_prefix_app(lock_url)
    hashed = f"api:{value_digest('secret-token')}"
    started(lock_client, [SlotLimit(hashed, 2, "redislock:")], "shared.fetch", "f-1")
    started(lock_client, [RateLimit("api:t1", Rate.parse("10/s"), "redislock:")],
            "shared.call", "c-1")
    started(lock_client, [SlotLimit("partner:acme", 1, "redislock:"),
                          RateLimit("partner:acme", Rate.parse("30/m"), "redislock:")],
            "shared.sync", "s-1", args="('acme',)")
    return app, hashed


def column(lines, name, header="RATE"):
    """The cell of column ``header`` in the row of ``name`` of a table's lines."""
    head = next(line for line in lines if line.startswith("NAME"))
    row = next(line for line in lines if line.startswith(name + " "))
    start = head.index(header)
    return row[start:].split("  ")[0].strip()


def test_every_view_shows_one_rate_written_one_way(shared, monkeypatch):
    """The key of the hashed template shows no rate (its task has none, though
    ``api:{token}`` could make the same name); the rate-only key shows ``-`` for its
    slots; the same rate reads ``10/s`` / ``30/m`` in status, watch, inspect, the web."""
    from celery_redislock.web.state import Dashboard

    app, hashed = shared
    monkeypatch.setenv("COLUMNS", "120")
    status = invoke(app, "status").stdout.splitlines()
    watch = invoke(app, "watch", "--once").stdout.splitlines()[1:]
    assert column(status, hashed) == column(watch, hashed) == "-"
    assert column(status, hashed, "USED") == "1/2"
    assert column(status, "api:t1") == column(watch, "api:t1") == "10/s"
    assert column(status, "api:t1", "USED") == column(watch, "api:t1", "USED") == "-"
    assert column(status, "partner:acme") == column(watch, "partner:acme") == "30/m"
    assert "rate: 30/m" in invoke(app, "inspect", "partner:acme").stdout.splitlines()
    assert "rate: -" in invoke(app, "inspect", hashed).stdout.splitlines()
    rows = {row["name"]: row for row in json.loads(invoke(app, "status", "--json").stdout)}
    assert (rows[hashed]["rate"], rows["api:t1"]["rate"], rows["partner:acme"]["rate"]) == (
        None, "10/s", "30/m")
    web = {row["name"]: row for row in Dashboard(LockStore(app)).state()["keys"]}
    assert web["partner:acme"]["rate_text"] == "30/m" and web[hashed]["rate_text"] is None
    assert invoke(app, "set-rate", "partner:acme", "600/minute").exit_code == 0
    status = invoke(app, "status").stdout.splitlines()
    assert column(status, "partner:acme") == "600/m (set-rate)"


def test_status_rows_are_sorted_and_fit_the_terminal(shared, lock_client, monkeypatch):
    app, _ = shared
    long_name = "tenant:" + "x" * 150
    for name in ("zeta", long_name, "alpha"):
        started(lock_client, [SlotLimit(name, 3, "redislock:")], "shared.x", f"id-{name[:5]}")
    monkeypatch.setenv("COLUMNS", "80")
    lines = invoke(app, "status").stdout.splitlines()
    names = [line.split()[0] for line in lines[1:]]
    assert names[0] == "alpha" and names[-1] == "zeta" and names == sorted(names)
    assert all(len(line) <= 80 for line in lines), lines
    assert "\u2026" in next(line for line in lines if line.startswith("tenant:"))
    watched = invoke(app, "watch", "--once").stdout.splitlines()[1:]
    assert [line.split()[0][:5] for line in watched if not line.startswith(" ")][1:] == [
        name[:5] for name in names]
    assert all(len(line) <= 80 for line in watched), watched
    wide = invoke(app, "status", "--wide").stdout.splitlines()
    assert any(line.startswith(long_name[:100] + "~ ") for line in wide)  # the name in Redis


def test_inspect_fits_the_terminal_and_release_takes_the_task_id(app, lock_client,
                                                               monkeypatch):
    task_id = str(uuid.uuid4())
    worker = "celery@a-rather-long-worker-host-name.example.internal"
    description = json.dumps({"task": "proj.tasks.sync_customer_accounts", "worker": worker,
                              "pid": 4242, "id": task_id,
                              "args": "('acme', 42) {'full': True, 'note': '" + "n" * 80 + "'}"})
    run = admit(lock_client, [SlotLimit(CRAWL, 2, "redislock:")], lease=30,
                owner=f"{worker}|{task_id}|", description=description)
    assert run.fence
    monkeypatch.setenv("COLUMNS", "80")
    lines = invoke(app, "inspect", CRAWL).stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if not line.startswith("key: ")), lines
    assert any(line.startswith(task_id + " ") for line in lines)  # never cut
    monkeypatch.setenv("COLUMNS", "120")
    lines = invoke(app, "inspect", CRAWL).stdout.splitlines()
    holder = next(line for line in lines if line.startswith(task_id))
    assert len(holder) <= 120 and "proj.tasks.sy" in holder and "('acme', 42)" in holder
    wide = invoke(app, "inspect", CRAWL, "--wide").stdout.splitlines()
    assert any(run.token in line and "'note'" in line and line.rstrip().endswith("'}")
               for line in wide)
    result = invoke(app, "release", CRAWL, task_id)
    assert result.exit_code == 0, result.output
    assert limit_state(app, CRAWL).used == 0
