"""``celery redislock set-weight / clear-weight / fair`` and the fair section of
``inspect``, in-process with Celery's CLI context, on a real redis-server."""

from __future__ import annotations

import json

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_redislock.admin import fair_control
from celery_redislock.admin.cli import redislock
from celery_redislock.admin.control import LimitControlError
from celery_redislock.engine.admission import SlotLimit
from celery_redislock.engine.parking import park_admit, run_id

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
    assert rows[0][2:] == ["3", "3"] and rows[1][2:] == ["1", "1"]
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
