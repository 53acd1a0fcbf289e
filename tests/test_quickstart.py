"""The README's quick start, end to end, as a new user runs it.

A fresh virtual environment; ``pip install`` of a copy of this source tree; the README's
opening snippet saved as ``proj.py``; a real prefork ``celery worker``; the README's own
command to send work; ``celery redislock status``. The worker runs ``proj`` through a
small module that records, in Redis, how many ``crawl`` bodies run at once (the README's
``crawl`` body is ``...``): the peak must be the README's 2, and every run must run once.

The new environment sees this environment's installed packages through a ``.pth`` file
(so Celery and redis-py need no download), but the package itself is installed into it
with pip from the copied sources, and its import is checked to come from there.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from support import wait_until
from test_docs import ROOT, snippets

pytestmark = pytest.mark.slow

PROBE = '''
"""Runs proj's worker with crawl's body recording how many bodies run at once."""
import os, time
import redis
import proj
from proj import app  # noqa: F401  (celery -A probe finds the app here)

record = redis.Redis.from_url(os.environ["RECORD_URL"])

def crawl(url):
    now = record.incr("running")
    record.rpush("peaks", now)
    time.sleep(0.3)
    record.decr("running")
    record.rpush("done", url)

proj.crawl.run = crawl
'''


def quick_start_command() -> str:
    """The README's step that sends work: ``python -c "from proj import crawl; ..."``."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r'^\s*(python -c "from proj import crawl.*")\s*$', text, re.M)
    assert match, "the quick start's send command is missing from README.md"
    return match.group(1)


def make_environment(where: Path) -> Path:
    """A fresh venv with this environment's packages visible, and the package pip-installed."""
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True)
    python = where / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    Path(site.stdout.strip(), "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = where / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "celery_redislock", source / "celery_redislock",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(source)], check=True,
                   timeout=600)
    return python


def test_the_readme_quick_start_runs_limited(tmp_path, redis_server):
    python = make_environment(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    url = f"redis://127.0.0.1:{redis_server.port}"
    opening = snippets(ROOT / "README.md")[0].code
    assert "import celery_redislock" in opening
    (project / "proj.py").write_text(opening.replace("redis://localhost:6379", url))
    (project / "probe.py").write_text(PROBE)
    record = redis_server.client(db=2)
    record.flushdb()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(RECORD_URL=f"{url}/2", PATH=f"{python.parent}{os.pathsep}{env['PATH']}")
    where = subprocess.run([str(python), "-c", "import celery_redislock; "
                            "print(celery_redislock.__file__)"], cwd=project, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "venv")), where

    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [str(python), "-m", "celery", "-A", "probe", "worker", "-c", "4",
         "--loglevel=INFO", "--without-mingle", "--without-gossip"],
        cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        subprocess.run(quick_start_command(), shell=True, cwd=project, env=env, check=True,
                       timeout=60)
        wait_until(lambda: record.llen("done") == 10, timeout=90, what="10 crawls done")
        assert max(int(peak) for peak in record.lrange("peaks", 0, -1)) == 2
        assert len(set(record.lrange("done", 0, -1))) == 10  # every run ran once
        status = subprocess.run([str(python), "-m", "celery", "-A", "proj", "redislock",
                                 "status"], cwd=project, env=env, capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert "Traceback" not in status.stderr
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        log.close()
    text = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in text, text[-5000:]
