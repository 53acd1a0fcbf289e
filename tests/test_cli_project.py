"""``celery -A proj.app redislock ...`` on a project laid out as users lay them out.

The app module only names its task modules (``include=[...]``, or
``autodiscover_tasks()``); the command loads them as ``celery worker`` does, so it knows
every task's limits: it refuses more than one slot for a ``SingletonTask``'s key, lists
names that only have a rate limiter, and suggests the name meant when one is misspelt.
Run as real ``celery`` subprocesses against the session's private redis-server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from celery_redislock import RateLimiter

from support import LOCK_DB

APP = {
    "include": """
        import os
        from celery import Celery

        app = Celery("proj", include=["proj.tasks"])
        app.conf.redislock_url = os.environ["LOCK_URL"]
        """,
    "autodiscover": """
        import os
        from celery import Celery

        app = Celery("proj")
        app.conf.redislock_url = os.environ["LOCK_URL"]
        app.autodiscover_tasks(["proj"])
        """,
}

TASKS = """
    from celery_redislock import LimitedTask, SingletonTask

    from proj.app import app

    @app.task(base=SingletonTask)
    def rebuild_index(): ...

    @app.task(base=SingletonTask, lock_key="report:{account_id}")
    def report(account_id): ...

    @app.task(base=LimitedTask, lock_slots=2)
    def crawl(url): ...

    @app.task(base=LimitedTask, lock_rate="10/s", lock_key="partner:{partner}")
    def ping(partner): ...
    """


@pytest.fixture(params=sorted(APP))
def project(request, tmp_path, redis_server, lock_client):
    package = tmp_path / "proj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "app.py").write_text(textwrap.dedent(APP[request.param]))
    (package / "tasks.py").write_text(textwrap.dedent(TASKS))
    return tmp_path


def celery(project: Path, redis_server, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(project),
           "LOCK_URL": redis_server.database_url(LOCK_DB)}
    return subprocess.run([sys.executable, "-m", "celery", "-A", "proj.app", "redislock",
                           *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)


def test_set_slots_refuses_several_slots_for_a_singleton(project, redis_server):
    done = celery(project, redis_server, "set-slots", "proj.tasks.rebuild_index", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "SingletonTask proj.tasks.rebuild_index" in done.stderr
    assert "refusing to set 3 slots" in done.stderr
    keyed = celery(project, redis_server, "set-slots", "report:42", "2", "--force")
    assert keyed.returncode == 1 and "SingletonTask proj.tasks.report" in keyed.stderr
    one = celery(project, redis_server, "set-slots", "proj.tasks.rebuild_index", "1")
    assert one.returncode == 0, one.stderr
    plain = celery(project, redis_server, "set-slots", "proj.tasks.crawl", "3")
    assert plain.returncode == 0, plain.stderr  # a task of an included module is known


def test_status_lists_a_name_with_only_a_rate_limiter(project, redis_server, lock_client):
    # a slow rate, whose state lives for a minute (a fast one's is gone within a second
    # of its last start, too soon for a command started afterwards to see it)
    assert RateLimiter(lock_client, "partner:acme", rate="1/m").try_acquire()
    done = celery(project, redis_server, "status", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["partner:acme"]["rate_limiter"] is True
    # The task's template gives the name 10/s, but its state in Redis was counted at 1/m
    # (by this RateLimiter): every view shows the rate that limits it, written one way.
    assert rows["partner:acme"]["rate"] == "1/m"
    text = celery(project, redis_server, "status")
    line = next(line for line in text.stdout.splitlines() if line.startswith("partner:acme"))
    assert line.split()[1] == "-" and line.endswith("  1/m")  # no slots: a rate alone
    watched = celery(project, redis_server, "watch", "--once")
    assert watched.returncode == 0, watched.stderr
    assert any(line.startswith("partner:acme") and line.rstrip().endswith("  1/m")
               for line in watched.stdout.splitlines()), watched.stdout


def test_a_misspelt_name_gets_a_suggestion(project, redis_server):
    done = celery(project, redis_server, "inspect", "proj.tasks.rebuild_indx")
    assert done.returncode == 1
    assert "did you mean 'proj.tasks.rebuild_index'" in done.stderr
    assert "Traceback" not in done.stderr
