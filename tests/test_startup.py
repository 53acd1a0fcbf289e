"""What a real ``celery worker`` prints when the package finds a problem at start.

Every start-up problem ends in one line naming what is wrong, where, and what to do — not
a traceback. A broken ``redislock_limits`` stops the worker; an unreachable lock store
does not (fail-closed: limited runs wait), but says which host and why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import pytest

from support import BROKER_DB

pytestmark = pytest.mark.slow

TESTS_DIRECTORY = Path(__file__).resolve().parent

APP = """
import os
from celery import Celery
import celery_redislock
from celery_redislock import LimitedTask

app = Celery("startup_app", broker=os.environ["BROKER_URL"])
app.conf.redislock_url = os.environ["LOCK_URL"]
app.conf.broker_connection_retry_on_startup = True

@app.task
def call_api(api_token, payload): ...

@app.task(base=LimitedTask, lock_slots=2)
def crawl(url): ...

app.conf.redislock_limits = {
    "startup_app.tasks.call_api": {"rate": "100/m", "key": "token:{api_token}"},
    "startup_app.crawl": {"slots": 0},
} if os.environ.get("BROKEN") else {}
if os.environ.get("LINE"):
    app.conf.redislock_line = os.environ["LINE"]
celery_redislock.install(app)
"""


def worker_command(tmp_path: Path) -> List[str]:
    (tmp_path / "startup_app.py").write_text(textwrap.dedent(APP))
    return [sys.executable, "-m", "celery", "-A", "startup_app", "worker", "-P", "solo",
            "--loglevel=INFO", "--without-mingle", "--without-gossip"]


def environment(tmp_path: Path, broker: str, lock: str, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{TESTS_DIRECTORY}",
            "BROKER_URL": broker, "LOCK_URL": lock, **extra}


def ours(output: str) -> List[str]:
    return [line for line in output.splitlines() if "celery-redislock" in line]


def test_broken_limits_stop_the_worker_with_one_line_each(tmp_path, redis_server):
    broker = redis_server.database_url(BROKER_DB)
    done = subprocess.run(
        worker_command(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=environment(tmp_path, broker, redis_server.url, BROKEN="1"))
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output, output
    lines = ours(output)
    assert len(lines) == 2, output
    assert any("['startup_app.tasks.call_api'] matches no registered task" in line
               and "did you mean 'startup_app.call_api" in line for line in lines), lines
    assert any("startup_app.crawl" in line and "slots must be a positive integer" in line
               for line in lines), lines
    assert "[tasks]" not in output  # refused before the banner


MISTAKES = """
import os
from celery import Celery
from celery_redislock import LimitedTask

app = Celery("mistakes_app", broker=os.environ["BROKER_URL"])
app.conf.redislock_url = os.environ["LOCK_URL"]

@app.task(base=LimitedTask, lock_slot=2)
def crawl(url): ...

@app.task(base=LimitedTask, lock_key="customer:{customerid}")
def sync_customer(customer_id, full=False): ...

@app.task(base=LimitedTask, lock_rate="10 per second")
def ping_partner(partner_id): ...

@app.task
def plain(): ...
"""

#: The problem each task of :data:`MISTAKES` has, as its one line says it.
PROBLEMS = {
    "crawl": "unknown option lock_slot (did you mean lock_slots?)",
    "sync_customer": "lock_key 'customer:{customerid}' names argument 'customerid', "
                     "which the task does not take (it takes: customer_id, full)",
    "ping_partner": "lock_rate '10 per second' is not a rate",
}


def test_task_option_mistakes_stop_the_worker_with_one_line_each(tmp_path, redis_server):
    """No install(), no redislock_limits: the worker checks every LimitedTask's options
    as it starts, as it checks the setting."""
    (tmp_path / "mistakes_app.py").write_text(textwrap.dedent(MISTAKES))
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "mistakes_app", "worker", "-P", "solo",
         "--loglevel=INFO", "--without-mingle", "--without-gossip"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=environment(tmp_path, redis_server.database_url(BROKER_DB), redis_server.url))
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    lines = ours(output)
    assert len(lines) == len(PROBLEMS), output
    for task, problem in PROBLEMS.items():
        assert any("CRITICAL" in line and "worker not started" in line
                   and f"Task 'mistakes_app.{task}': {problem}" in line for line in lines), lines
    assert "[tasks]" not in output  # refused before the banner


@pytest.mark.parametrize("call", ["crawl.delay('u')", "sync_customer.delay(7)",
                                  "ping_partner.apply_async(('acme',))"])
def test_a_mistake_in_task_options_is_a_short_error_at_delay(tmp_path, redis_server, call):
    """The error a sender sees names the task and the problem in its last line, under a
    traceback of the sender's own call only: no chained exception, no Celery frames."""
    (tmp_path / "mistakes_app.py").write_text(textwrap.dedent(MISTAKES))
    done = subprocess.run(
        [sys.executable, "-c", f"from mistakes_app import *\n{call}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=environment(tmp_path, redis_server.database_url(BROKER_DB), redis_server.url))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) <= 6, done.stderr  # Traceback, <string>, delay/apply_async, message
    assert "During handling" not in done.stderr and "celery/" not in done.stderr
    task = call.split(".")[0]
    assert lines[-1].startswith("celery_redislock.errors.LockConfigurationError: "
                                f"Task 'mistakes_app.{task}': {PROBLEMS[task]}"), lines[-1]


@pytest.mark.parametrize(("lock_url", "reason"), [
    ("redis://:s3cret@no-such-host.invalid:6379/1", "no-such-host.invalid:6379: the host name "
                                                    "does not resolve (DNS)"),
    ("redis://127.0.0.1:{closed}/1", "127.0.0.1:{closed}: connection refused"),
], ids=["dns", "refused"])
def test_unreachable_lock_store_is_named_in_one_line(tmp_path, redis_server, closed_port,
                                                     lock_url, reason):
    lock_url, reason = lock_url.format(closed=closed_port), reason.format(closed=closed_port)
    broker = redis_server.database_url(BROKER_DB)
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(worker_command(tmp_path), cwd=tmp_path, stdout=sink,
                                  stderr=subprocess.STDOUT,
                                  env=environment(tmp_path, broker, lock_url))
    try:
        deadline = time.monotonic() + 60
        while not ours(log.read_text()) and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()  # fail-closed: it keeps running
            time.sleep(0.1)
        lines = ours(log.read_text())
        assert len(lines) == 1, log.read_text()
        assert f"lock store {reason}" in lines[0]
        assert "fail-closed" in lines[0] and "redislock_url" in lines[0]
        assert "s3cret" not in log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.parametrize("line", ["store", ""])
def test_the_old_line_is_said_retired_once_at_start(tmp_path, redis_server, line):
    """``redislock_line = "store"``: one warning as the worker starts, saying it is retired
    and ignored; on the default line, none."""
    broker = redis_server.database_url(BROKER_DB)
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        worker = subprocess.Popen(worker_command(tmp_path), cwd=tmp_path, stdout=sink,
                                  stderr=subprocess.STDOUT,
                                  env=environment(tmp_path, broker, redis_server.url,
                                                  LINE=line))
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.1)
        assert " ready." in log.read_text(), log.read_text()
        said = [text for text in ours(log.read_text()) if "retired" in text]
        if line:
            assert len(said) == 1 and "WARNING" in said[0], log.read_text()
            assert 'redislock_line = "store" is retired' in said[0]
        else:
            assert said == [], said
    finally:
        worker.terminate()
        worker.wait(timeout=30)
