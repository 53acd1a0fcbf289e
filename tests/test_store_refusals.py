"""A lock store that refuses is not an outage; one that evicts is not safe.

Each test runs its own redis-server set up to refuse in one way: a wrong password, an
ACL user lacking a command, a read-only replica, ``maxmemory`` with ``noeviction`` (a
full store) or an evicting policy. Configuration errors stop a worker at start with the
server's message; at run time a full store, a refused command and a replica each read as
what they are (logged with the server's message, counted), and no run is lost or run
without its limit.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner
from store_app import BROKER_ENV, LOCK_ENV, REQUIRE_NOEVICTION_ENV

from celery_redislock import LimitedTask, LockStoreUnavailable, Semaphore
from celery_redislock.admin.cli import redislock
from celery_redislock.config.settings import redis_client
from celery_redislock.engine.refusal import REQUIRED_COMMANDS, acl_setuser
from celery_redislock.gate.startup import check_lock_store
from celery_redislock.metrics import MemorySink, disable_metrics, enable_metrics

from redis_process import RedisServer
from support import FAST_RETRY, wait_until

TESTS = Path(__file__).parent
SECURITY_DOC = TESTS.parent / "docs" / "security.md"


def _server(*args: str) -> RedisServer:
    return RedisServer(extra_args=list(args)).start()


@pytest.fixture
def servers():
    started = []

    def start(*args: str) -> RedisServer:
        server = _server(*args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.cleanup()


def _worker(broker: str, lock: str, *extra_env: tuple, logfile: Path) -> subprocess.Popen:
    env = {**os.environ, BROKER_ENV: broker, LOCK_ENV: lock, **dict(extra_env),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "store_app", "worker", "--pool", "solo",
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info",
         "--logfile", str(logfile), "-n", f"store-{os.getpid()}@test"],
        cwd=TESTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _refused_start(broker: str, lock: str, logfile: Path, *extra_env: tuple) -> str:
    """Start a worker that must refuse to start: its exit status is not 0, within 60 s;
    its output and log file."""
    started = time.monotonic()
    process = _worker(broker, lock, *extra_env, logfile=logfile)
    try:
        output, _ = process.communicate(timeout=60)
        print(f"\nworker refused to start after {time.monotonic() - started:.2f} s")
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the worker started (it ran for 60 s) instead of refusing to start")
    log = logfile.read_text(errors="replace") if logfile.exists() else ""
    assert process.returncode != 0, output
    return output.decode(errors="replace") + log


def test_wrong_password_stops_the_worker_at_start(servers, tmp_path):
    broker = servers()
    store = servers("--requirepass", "right")
    text = _refused_start(broker.url, f"redis://:wrong@127.0.0.1:{store.port}/0",
                          tmp_path / "worker.log")
    assert "invalid username-password pair" in text, text
    assert "redislock_url" in text, text
    # One line, and a true one: not also "limited tasks wait (fail-closed)" nor a
    # warning about freeing slots of a worker that never started.
    ours = {line.split("celery-redislock: ", 1)[1] for line in text.splitlines()
            if "celery-redislock" in line}  # the output and the log file both have it
    assert len(ours) == 1, text
    assert "worker not started: the lock store refuses this worker" in ours.pop()
    assert "fail-closed" not in text and "could not free" not in text, text


def test_acl_user_lacking_a_command_stops_the_worker_at_start(servers, tmp_path):
    broker = servers()
    store = servers()
    store.client().execute_command("ACL", "SETUSER", "locks", "on", ">pw", "~redislock:*",
                                   "+@all", "-evalsha", "-eval")
    text = _refused_start(broker.url, f"redis://locks:pw@127.0.0.1:{store.port}/0",
                          tmp_path / "worker.log")
    assert "NOPERM" in text and "evalsha" in text.lower(), text


def test_evicting_lock_store_refused_when_noeviction_is_required(servers, tmp_path):
    broker = servers()
    store = servers("--maxmemory-policy", "volatile-lru")
    text = _refused_start(broker.url, store.url, tmp_path / "worker.log",
                          (REQUIRE_NOEVICTION_ENV, "1"))
    assert "volatile-lru" in text and "noeviction" in text, text


def test_evicting_lock_store_warns_at_worker_start(servers, tmp_path):
    broker = servers()
    store = servers("--maxmemory-policy", "allkeys-lru")
    logfile = tmp_path / "worker.log"
    process = _worker(broker.url, store.url, logfile=logfile)
    try:
        wait_until(lambda: logfile.exists() and "ready." in logfile.read_text(errors="replace"),
                   60, 0.1, "the worker to start")
        log = logfile.read_text(errors="replace")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    warnings = [line for line in log.splitlines() if "maxmemory-policy" in line]
    assert warnings and "allkeys-lru" in warnings[0] and "WARNING" in warnings[0], log


def _cli_status(app, *args: str):
    """``celery redislock status`` (or another command: ``args``), in-process."""
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    obj = CLIContext(app=app, no_color=True, workdir=None, quiet=True)
    return runner.invoke(redislock, list(args or ["status"]), obj=obj)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "noeviction"])
def test_status_reports_an_evicting_policy(servers, celery_app, policy):
    store = servers("--maxmemory-policy", policy)
    celery_app.conf.redislock_url = store.url
    result = _cli_status(celery_app)
    assert result.exit_code == 0, result.output
    if policy == "noeviction":
        assert "maxmemory-policy" not in result.stderr
    else:
        assert f"maxmemory-policy is {policy}" in result.stderr, result.stderr


def test_status_says_when_config_get_is_refused(servers, celery_app):
    store = servers()
    store.client().execute_command("ACL", "SETUSER", "locks", "on", ">pw", "~redislock:*",
                                   "+@all", "-config")
    celery_app.conf.redislock_url = f"redis://locks:pw@127.0.0.1:{store.port}/0"
    result = _cli_status(celery_app)
    assert result.exit_code == 0, result.output
    assert "could not read maxmemory-policy" in result.stderr, result.stderr


@pytest.fixture
def sink(celery_app):
    sink = MemorySink()
    enable_metrics(celery_app, sink=sink)
    yield sink
    disable_metrics(celery_app)


def _limited(celery_app, name, **options):
    @celery_app.task(base=LimitedTask, lock_key=name, shared=False, name=f"refusals.{name}",
                     **FAST_RETRY, **options)
    def limited():
        return "ran"

    return limited


def held(sink, task, kind):
    """Whether a run of ``task`` was held for a store error of ``kind``: the worker's main
    process holds it, one message asking again (never sent back)."""
    return sink.value("lock_store_errors_total", task=task.name, kind=kind) >= 1


def errors_of(sink, task, kind):
    """How many store errors of ``kind`` the runs of ``task`` met (one per ask)."""
    return int(sink.value("lock_store_errors_total", task=task.name, kind=kind))


def test_full_lock_store_fails_closed_and_says_so(servers, celery_app, celery_worker,
                                                  deliveries, sink, caplog):
    store = servers("--maxmemory-policy", "noeviction")
    celery_app.conf.redislock_url = store.url
    task = _limited(celery_app, "full")
    celery_worker.reload()
    admin = store.client()
    admin.config_set("maxmemory", 1)
    with caplog.at_level(logging.WARNING):
        result = task.delay()
        wait_until(lambda: held(sink, task, "full"), what="the run held (full)")
    assert not result.ready()
    full = [r.getMessage() for r in caplog.records
            if "lock store full" in r.getMessage() and r.levelno >= logging.ERROR]
    assert full and "OOM" in full[0] and task.name in full[0], full
    assert sink.value("lock_store_errors_total", task=task.name, kind="full") >= 1
    admin.config_set("maxmemory", 0)
    fixed = time.monotonic()
    assert result.get(timeout=15) == "ran"
    print(f"\nmemory freed: the run ran {time.monotonic() - fixed:.2f} s later, "
          f"held through {errors_of(sink, task, 'full')} store errors")
    assert deliveries[result.id] == 1  # its run; never refused, never sent back


def test_full_lock_store_eager_run_raises_with_the_servers_message(servers, celery_app):
    store = servers("--maxmemory-policy", "noeviction")
    celery_app.conf.redislock_url = store.url
    task = _limited(celery_app, "full-eager")
    store.client().config_set("maxmemory", 1)
    with pytest.raises(LockStoreUnavailable, match=r"full.*OOM"):
        task.apply().get()


#: How soon (s) a run held for a read-only replica runs once it is promoted: the main
#: process asks again after a pause of at most 1 s (0.5 s, then 1 s); the margin is for
#: a loaded machine (it took 5 s before the pause was shortened).
READONLY_RECOVERY = 2.0


@pytest.mark.parametrize("gate", ["blocking", "async"])
def test_read_only_replica_is_waited_out_like_an_outage(servers, celery_app, celery_worker,
                                                        deliveries, sink, caplog, gate):
    primary = servers()
    replica = servers("--replicaof", "127.0.0.1", str(primary.port))
    celery_app.conf.redislock_url = replica.url
    celery_app.conf.redislock_gate = gate
    task = _limited(celery_app, "replica")
    celery_worker.reload()
    with caplog.at_level(logging.WARNING):
        result = task.delay()
        wait_until(lambda: held(sink, task, "readonly"), what="the run held (readonly)")
    assert not result.ready()
    said = [r.getMessage() for r in caplog.records if "READONLY" in r.getMessage()]
    assert said and "read-only" in said[0], said
    assert sink.value("lock_store_errors_total", task=task.name, kind="readonly") >= 1
    # A fail-over that lasts: the pause between asks has grown to its longest (1 s).
    wait_until(lambda: errors_of(sink, task, "readonly") >= 3, what="three asks refused")
    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    fixed = time.monotonic()
    assert result.get(timeout=15, interval=0.01) == "ran"  # polled finely: a figure
    recovered = time.monotonic() - fixed
    print(f"\nreplica promoted ({gate} gate): the run ran {recovered:.2f} s later, "
          f"held through {errors_of(sink, task, 'readonly')} store errors")
    assert deliveries[result.id] == 1  # its run; never refused, never sent back
    assert recovered < READONLY_RECOVERY, recovered


def test_permission_refused_at_run_time_is_an_error_and_loses_nothing(
        servers, celery_app, celery_worker, deliveries, sink, caplog):
    store = servers()
    admin = store.client()
    admin.execute_command("ACL", "SETUSER", "locks", "on", ">pw", "~redislock:*", "+@all")
    celery_app.conf.redislock_url = f"redis://locks:pw@127.0.0.1:{store.port}/0"
    task = _limited(celery_app, "noperm")
    celery_worker.reload()
    admin.execute_command("ACL", "SETUSER", "locks", "-evalsha", "-eval")
    with caplog.at_level(logging.WARNING):
        result = task.delay()
        wait_until(lambda: held(sink, task, "permission"), what="the run held (permission)")
    assert not result.ready()
    errors = [r.getMessage() for r in caplog.records
              if "NOPERM" in r.getMessage() and r.levelno >= logging.ERROR]
    assert errors and task.name in errors[0], errors
    assert sink.value("lock_store_errors_total", task=task.name, kind="permission") >= 1
    admin.execute_command("ACL", "SETUSER", "locks", "+evalsha", "+eval")
    fixed = time.monotonic()
    assert result.get(timeout=15) == "ran"
    print(f"\npermission granted: the run ran {time.monotonic() - fixed:.2f} s later, "
          f"held through {errors_of(sink, task, 'permission')} store errors")
    assert deliveries[result.id] == 1  # its run; never refused, never sent back


def test_the_documented_acl_user_can_do_everything_the_package_does(
        servers, celery_app, celery_worker, lock_client, deliveries):
    """A lock store user with exactly the ``ACL SETUSER`` line of docs/security.md: a worker starts
    on it, runs wait in line and are handed their slot, a rate limit admits, the status
    command reads every key; nothing is refused."""
    store = servers()
    admin = store.client()
    arguments = acl_setuser("redislock", "pw")
    assert " ".join(arguments).replace(">pw", ">CHANGE-ME") in SECURITY_DOC.read_text()
    admin.execute_command(*arguments)
    celery_app.conf.redislock_url = f"redis://redislock:pw@127.0.0.1:{store.port}/0"
    check_lock_store(celery_app)  # what a worker runs as it starts
    ran = []

    @celery_app.task(base=LimitedTask, lock_key="acl-line", shared=False, **FAST_RETRY)
    def waiting(n):
        ran.append(n)
        return n

    @celery_app.task(base=LimitedTask, lock_rate="100/s", shared=False)
    def rated():
        return "rated"

    celery_worker.reload()
    client = redis_client(celery_app)
    held = Semaphore(client, "acl-line", slots=1, lease=30).acquire(blocking=False)
    results = [waiting.delay(n) for n in range(3)]
    wait_until(lambda: all(deliveries[result.id] >= 1 for result in results),
               what="three runs refused")  # parked: the worker's poll hands the slot over
    Semaphore(client, "acl-line", slots=1).release(held)
    assert sorted(result.get(timeout=15) for result in results) == [0, 1, 2]
    assert rated.delay().get(timeout=10) == "rated"
    result = _cli_status(celery_app)
    assert result.exit_code == 0 and "acl-line" in result.output, result.output
    assert "NOPERM" not in result.stderr + result.output
    assert "maxmemory-policy" not in result.stderr  # CONFIG GET is allowed
    for command in (["inspect", "acl-line"], ["pause", "acl-line", "--for", "30s"],
                    ["resume", "acl-line"], ["set-slots", "acl-line", "2"],
                    ["clear-slots", "acl-line"], ["reap"]):
        result = _cli_status(celery_app, *command)
        assert result.exit_code == 0, (command, result.output, result.stderr)
    assert admin.acl_log() == [], admin.acl_log()


def test_an_unreachable_lock_store_does_not_stop_a_worker_from_starting(celery_app,
                                                                        closed_port):
    """A worker may start before its lock store: the start check lets it start, even
    with redislock_require_noeviction (runs wait for the store; the worker's start logs
    one line saying where the store is and why it cannot be reached)."""
    celery_app.conf.redislock_url = f"redis://127.0.0.1:{closed_port}/0"
    celery_app.conf.redislock_require_noeviction = True
    check_lock_store(celery_app)  # does not raise


def test_scripts_fall_back_to_no_flags_on_a_redis_that_does_not_know_them():
    """Redis 6.2 cannot compile a ``#!lua`` first line: the first refusal marks the
    client, which then gets every script without it."""
    from redis.exceptions import NoScriptError, ResponseError

    from celery_redislock.engine.scripts import HOLDERS

    class OldRedis:
        def __init__(self):
            self.calls = []

        def execute_command(self, *command):
            self.calls.append(command[:2])
            if command[0] == "EVALSHA":
                raise NoScriptError("No matching script")
            if command[1].startswith("#!"):
                raise ResponseError("Error compiling script (new function): user_script:1: "
                                    "unexpected symbol near '#'")
            return 0

    client = OldRedis()
    assert HOLDERS.run(client, ["k"], []) == 0
    assert HOLDERS.run(client, ["k"], []) == 0
    assert client.calls[-2:] == [("EVALSHA", HOLDERS.plain_sha),
                                 ("EVAL", HOLDERS.plain_source)]


def test_every_command_of_the_scripts_is_in_the_documented_acl() -> None:
    """A command a Lua script calls is refused to the documented user unless it is
    listed: every ``redis.call`` in ``engine/lua/`` must be in REQUIRED_COMMANDS."""
    lua = Path(__file__).resolve().parents[1] / "celery_redislock" / "engine" / "lua"
    called = {name.lower() for path in lua.glob("*.lua")
              for name in re.findall(r"redis\.call\('([A-Za-z]+)'", path.read_text())}
    assert called - set(REQUIRED_COMMANDS) == set()
