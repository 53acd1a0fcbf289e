"""``celery redislock set-weight / clear-weight / fair`` and the fair section of
``inspect``, in-process with Celery's CLI context, on a real redis-server."""

from __future__ import annotations

import json

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock.admin import fair_control
from celery_redislock.admin.cli import LockStore, redislock
from celery_redislock.admin.control import LimitControlError
from celery_redislock.engine.admission import SlotLimit
from celery_redislock.engine.parking import park_admit, run_id
from celery_redislock.web.state import Dashboard

from cli_app import create_app
from support import LOCK_DB

NAME = "fair-cli"


@pytest.fixture
def app(redis_server, lock_client):
    return create_app(f"redis://127.0.0.1:{redis_server.port}/{LOCK_DB}")


def invoke(app, *args):
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click 8.2+
        runner = CliRunner()
    return runner.invoke(redislock, list(args),
                         obj=CLIContext(app=app, no_color=True, workdir=None, quiet=True))


def park(client, sub: str, task: str):
    return park_admit(client, [SlotLimit(NAME, 1, "redislock:", 1, sub)], lease=30,
                      run=run_id(task, 0))


def test_set_weight_then_fair_shows_the_sub_lines(app, lock_client):
    result = invoke(app, "set-weight", NAME, "tenant:a", "3")
    assert result.exit_code == 0, result.output
    assert "weight of tenant:a set to 3" in result.output
    assert fair_control.weights(lock_client, NAME) == {"tenant:a": 3.0}
    park(lock_client, "tenant:a", "holder")
    for n in range(3):
        park(lock_client, "tenant:a", f"a{n}")
    park(lock_client, "tenant:b", "b0")
    shown = invoke(app, "fair", NAME)
    assert shown.exit_code == 0, shown.output
    assert "2 sub-line(s) waiting" in shown.output
    rows = [line.split() for line in shown.output.splitlines()[2:]]
    assert [row[0] for row in rows] == ["tenant:a", "tenant:b"]
    assert rows[0][2:] == ["3", "3", "-"] and rows[1][2:] == ["1", "1", "-"]
    data = json.loads(invoke(app, "fair", NAME, "--json", "--top", "1").output)
    assert data["sub_lines_waiting"] == 2 and len(data["first"]) == 1
    inspected = invoke(app, "inspect", NAME)
    assert inspected.exit_code == 0, inspected.output
    assert "fair: 2 sub-line(s) waiting" in inspected.output
    assert json.loads(invoke(app, "inspect", NAME, "--json").output)["fair"][
        "sub_lines_waiting"] == 2
    cleared = invoke(app, "clear-weight", NAME, "tenant:a")
    assert cleared.exit_code == 0 and "cleared" in cleared.output
    assert fair_control.weights(lock_client, NAME) == {}


def test_a_bad_weight_is_refused(app, lock_client):
    result = invoke(app, "set-weight", NAME, "tenant:a", "0")
    assert result.exit_code == 1
    assert "above 0" in (result.stderr if hasattr(result, "stderr") else result.output)
    with pytest.raises(LimitControlError):
        fair_control.set_weight(lock_client, NAME, "tenant:a", -2)


def test_status_counts_the_sub_lines_and_fair_shows_the_oldest_in_bands(app, lock_client):
    park(lock_client, "tenant:a", "holder")
    for n in range(2):  # priority 0, the default aging (10 s): since = the band's score
        park_admit(lock_client, [SlotLimit(NAME, 1, "redislock:", 1, "tenant:a")], lease=30,
                   run=run_id(f"a{n}", 0), priority=0)
    park(lock_client, "tenant:b", "b0")  # no priority: its oldest waiter is not kept
    park(lock_client, "tenant:c", "c0")
    status = json.loads(invoke(app, "status", "--json").output)
    row = next(row for row in status if row["name"] == NAME)
    assert row["parked"]["fair_sub_lines"] == 3 and row["waiting"] == 4
    text = invoke(app, "status", "--wide").output.splitlines()
    assert text[0].split()[-1] == "SUB-LINES"
    assert next(line for line in text if line.startswith(NAME)).split()[-1] == "3"

    data = json.loads(invoke(app, "fair", NAME, "--json", "--top", "2").output)
    assert data["sub_lines_waiting"] == 3 and len(data["first"]) == 2  # top N, never all
    ages = {sub["sub"]: sub["oldest_age_seconds"] for sub in data["first"]}
    assert 0 <= ages["tenant:a"] < 30 and ages["tenant:b"] is None
    shown = invoke(app, "inspect", NAME).output
    assert "OLDEST" in shown and "fair: 3 sub-line(s) waiting" in shown
    assert "3 fair sub-line(s) waiting" in shown  # the parked line's summary, as in watch

    keys = {row["name"]: row for row in Dashboard(LockStore(app), min_interval=0).state()["keys"]}
    fair = keys[NAME]["fair"]
    assert fair["sub_lines_waiting"] == 3 and [sub["sub"] for sub in fair["first"]][:1] == [
        "tenant:a"]
    assert all(row["fair"] is None for name, row in keys.items() if name != NAME)
