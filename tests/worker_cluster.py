"""Real ``celery worker`` processes for end-to-end tests, and the pytest fixture that starts them.

A :class:`WorkerCluster` runs several ``celery -A <module> worker`` processes (prefork pool)
against a private :class:`~redis_process.RedisServer` that serves as broker, result
backend, lock store and record store (one database each, see
:class:`worker_app.AppUrls`). Each worker writes its output to a log file of its own; the
logs are printed when a test that used the cluster fails, or when the cluster fails to
start.

It is a pytest plugin, declared once in ``conftest.py``, which gives
the ``worker_cluster_factory`` fixture::

    def test_something(worker_cluster_factory):
        cluster = worker_cluster_factory(workers=3, concurrency=3)
        result = cluster.app.send_task("worker_app.limited_sleep", (0.1,))
        assert result.get(timeout=30)

and ``start_workers``, for the workers of one test app with some environment::

    cluster = start_workers("parking_app", {LINE_ENV: "broker"}, concurrency=2)

Every cluster the factory started is killed (SIGKILL) at the end of the test, and its
Redis server stopped with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional

import kombu.exceptions
import pytest
import redis
from celery import Celery

import worker_app
from redis_process import RedisServer
from worker_app import AppUrls

TESTS_DIRECTORY = Path(__file__).resolve().parent

#: How much of each worker log is printed on failure (characters, from the end).
LOG_TAIL = 20_000

WorkerClusterFactory = Callable[..., "WorkerCluster"]


class WorkerStartError(RuntimeError):
    """A worker process did not answer a ping in time while the cluster started."""


class WorkerExited(RuntimeError):
    """A worker process exited while it should be running."""


class WorkerProcess:
    """One ``celery worker`` subprocess, in a process group of its own, logging to a file."""

    def __init__(self, name: str, command: List[str], env: Dict[str, str],
                 log_path: Path, node: Optional[str] = None) -> None:
        self.name = name
        #: The node name before the ``@`` (``-n``): ``name`` unless it is a namesake's.
        self.node = node or name
        self.command = command
        self.env = env
        self.log_path = log_path
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None

    def start(self) -> None:
        """Start the process; its stdout and stderr go to :attr:`log_path`."""
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command, env=self.env, cwd=TESTS_DIRECTORY, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    @property
    def returncode(self) -> Optional[int]:
        """The exit status, or None while the process runs (or was never started)."""
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        """Ask for a warm shutdown (SIGTERM to the worker's main process)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> bool:
        """Wait until the process exits or the ``time.monotonic()`` deadline; True if it did."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the worker's whole process group: its main process and pool children."""
        if self.process is None:
            return
        self._kill_group()
        self.process.wait()

    def reap_children(self) -> None:
        """SIGKILL pool children left behind once the main process has exited."""
        if self.process is not None:
            self._kill_group()

    def _kill_group(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):  # group already empty
            os.killpg(self.process.pid, signal.SIGKILL)

    def close_log(self) -> None:
        """Close this side's handle on the log file."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self, start: int = 0) -> str:
        """The log from byte offset ``start`` on, at most :data:`LOG_TAIL` characters."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(start)
                text = log.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log file)"
        if len(text) > LOG_TAIL:
            text = "[...]\n" + text[-LOG_TAIL:]
        return text

    def log_size(self) -> int:
        """The log file's current length in bytes."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0


class WorkerCluster:
    """Several real Celery workers of ``app_module`` on a private Redis server.

    ``workers`` processes run ``celery -A <app_module> worker -P <pool> -c <concurrency>``
    (``pool`` is prefork unless said),
    named ``worker<i>@%h-<pid>`` (the test process's pid: two test processes that start
    clusters at once on one RabbitMQ must not share a node name, whose remote-control
    queue is exclusive), without gossip, mingle or heartbeat. ``app`` is a client-side
    instance of the same app (made by ``app_factory``) on the same URLs, for sending tasks
    and reading results; ``urls`` tells where everything is.

    Use :meth:`start` and :meth:`stop`, or ``with WorkerCluster(...) as cluster:``.
    """

    def __init__(
        self,
        log_directory: Path,
        *,
        app_module: str = "worker_app",
        app_factory: Callable[[AppUrls], Celery] = worker_app.create_app,
        workers: int = 3,
        concurrency: int = 3,
        extra_args: Optional[List[str]] = None,
        pool: str = "prefork",
        separate_lock_store: bool = False,
        start_timeout: float = 60.0,
        stop_timeout: float = 20.0,
    ) -> None:
        self.log_directory = Path(log_directory)
        self.app_module = app_module
        self.app_factory = app_factory
        self.workers = workers
        self.concurrency = concurrency
        self.extra_args = list(extra_args or [])
        #: The worker's pool (``-P``): prefork, threads, solo...
        self.pool = pool
        self.separate_lock_store = separate_lock_store
        #: With ``separate_lock_store``: the lock store's own server, which a test may
        #: kill and restart without touching the broker.
        self.lock_redis: Optional[RedisServer] = None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.redis: Optional[RedisServer] = None
        self.urls: Optional[AppUrls] = None
        self._app: Optional[Celery] = None
        self.processes: List[WorkerProcess] = []

    @property
    def app(self) -> Celery:
        """The client-side app (available once the cluster has started)."""
        if self._app is None:
            raise RuntimeError("the worker cluster has not been started")
        return self._app

    @property
    def names(self) -> List[str]:
        """The worker node names before the ``@`` (each once, namesakes share one)."""
        return list(dict.fromkeys(process.node for process in self.processes))

    def start(self) -> WorkerCluster:
        """Start Redis and the workers, and wait until every worker answers a ping.

        Raises :class:`WorkerExited` or :class:`WorkerStartError`, with the workers' logs,
        when one exits or does not answer within ``start_timeout`` seconds; what was
        started is stopped then.
        """
        self.log_directory.mkdir(parents=True, exist_ok=True)
        try:
            self.redis = RedisServer().start()
            self.urls = AppUrls.on_server(self.redis.url)
            if self.separate_lock_store:
                self.lock_redis = RedisServer().start()
                self.urls = dataclasses.replace(self.urls, lock=self.lock_redis.url)
            self._app = self.app_factory(self.urls)
            # A result still referred to after the cluster stopped (say, by a failed
            # test's traceback) must not spend seconds retrying when it is collected.
            self._app.conf.result_backend_transport_options = {
                "retry_policy": {"max_retries": 0},
            }
            env = self._worker_environment(self.urls)
            for index in range(1, self.workers + 1):
                name = f"worker{index}"
                process = WorkerProcess(
                    name, self._worker_command(name), env,
                    self.log_directory / f"{name}.log",
                )
                self.processes.append(process)
                process.start()
            self.wait_until_ready(self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def add_namesake(self, name: str, of: str) -> WorkerProcess:
        """Start one more worker, known to the test as ``name``, under the node name of
        worker ``of`` (two ``celery worker`` processes with the same ``-n``), and wait
        until it logs that it is ready."""
        assert self.urls is not None
        process = WorkerProcess(name, self._worker_command(of),
                                self._worker_environment(self.urls),
                                self.log_directory / f"{name}.log", node=of)
        self.processes.append(process)
        self.start_process_and_wait(process)
        return process

    def start_process_and_wait(self, process: WorkerProcess,
                               timeout: Optional[float] = None) -> None:
        """(Re)start ``process`` once it has exited, and wait until its log says it is
        ready (a namesake cannot be told apart by a ping)."""
        if process.returncode is None and process.process is not None:
            raise RuntimeError(f"worker {process.name} is still running")
        process.reap_children()
        process.close_log()
        offset = process.log_size()
        process.start()
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while " ready." not in process.log_text(offset):
            self.check_running()
            if time.monotonic() > deadline:
                raise WorkerStartError(f"worker {process.name} did not start\n{self.logs()}")
            time.sleep(0.05)

    def _worker_command(self, name: str) -> List[str]:
        return [
            sys.executable, "-m", "celery", "-A", self.app_module, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-n", f"{name}@%h-{os.getpid()}",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-l", "info", *self.extra_args,
        ]

    @staticmethod
    def _worker_environment(urls: AppUrls) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(urls.environment())
        paths = [str(TESTS_DIRECTORY), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("CELERY_CONFIG_MODULE", None)
        return env

    def wait_until_ready(self, timeout: float) -> None:
        """Poll with ``ping`` until every worker answers, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        expected = set(self.names)
        while True:
            self.check_running()
            replies = self._ping()
            answered = {name.split("@", 1)[0] for reply in replies for name in reply}
            if expected <= answered:
                return
            if time.monotonic() > deadline:
                raise WorkerStartError(
                    f"workers {sorted(expected - answered)} did not answer a ping within "
                    f"{timeout} s\n{self.logs()}"
                )

    def _ping(self) -> List[Dict[str, object]]:
        """One ``ping`` round; none answered when the broker connection broke meanwhile.

        A connection of the client-side app may be closed under it while the machine is
        loaded (seen once in CI, the broker's server still running): the pool's
        connections are dropped and the next round opens a fresh one (the pool itself
        stays open: ``force_close_all`` marks it closed, and every later round then
        failed with "Acquire on closed pool"). A broker server that exited is reported
        at once, with its log.
        """
        try:
            return self.app.control.ping(timeout=0.5) or []
        except (OSError, redis.RedisError, kombu.exceptions.OperationalError) as error:
            broker = self.redis
            if broker is None or broker.process is None or broker.process.poll() is not None:
                raise WorkerStartError(f"the broker's redis-server exited: {error}\n"
                                       f"{self._broker_log()}") from error
            pool = self.app.pool
            pool.force_close_all()
            pool._closed = False  # reopened, empty (force_close_all marks it closed)
            return []

    def _broker_log(self) -> str:
        if self.redis is None:
            return ""
        path = self.redis.directory / "redis.log"
        return path.read_text(errors="replace")[-LOG_TAIL:] if path.exists() else ""

    def worker(self, name: str) -> WorkerProcess:
        """The worker process named ``name`` (``"worker1"``, ...)."""
        for process in self.processes:
            if process.name == name:
                return process
        raise KeyError(f"no worker named {name!r} in {self.names}")

    def restart_worker(self, name: str, timeout: Optional[float] = None) -> None:
        """Start worker ``name`` again, under the same node name, once it has exited (or
        was killed), and wait until every worker answers a ping (``timeout`` seconds,
        ``start_timeout`` by default). Its log goes on in the same file."""
        process = self.worker(name)
        if process.returncode is None and process.process is not None:
            raise RuntimeError(f"worker {name} is still running")
        process.reap_children()
        process.close_log()
        process.start()
        self.wait_until_ready(self.start_timeout if timeout is None else timeout)

    def check_running(self) -> None:
        """Raise :class:`WorkerExited`, with the logs, if a worker process has exited."""
        for process in self.processes:
            if process.returncode is not None:
                raise WorkerExited(
                    f"worker {process.name} exited with status {process.returncode}\n"
                    f"{self.logs()}"
                )

    def stop(self, warm: bool = True) -> None:
        """Stop every worker (SIGTERM, then SIGKILL after ``stop_timeout`` s), then Redis.

        With ``warm=False`` the workers are SIGKILLed at once, pool children and all: for
        a cluster that is done with, whose Redis goes next (a warm shutdown of a prefork
        worker takes about two seconds, that nothing looks at).
        """
        for process in self.processes:
            if warm:
                process.terminate()
            else:
                process.kill()
        deadline = time.monotonic() + self.stop_timeout
        for process in self.processes:
            if not process.wait(deadline):
                process.kill()
            process.reap_children()
            process.close_log()
        if self._app is not None:
            # Results that nothing refers to any more unsubscribe from the result backend
            # when collected: let that happen now, while Redis still answers.
            gc.collect()
            self._app.close()
        if self.redis is not None:
            self.redis.cleanup()
            self.redis = None
        if self.lock_redis is not None:
            self.lock_redis.cleanup()
            self.lock_redis = None

    def log_offsets(self) -> Dict[str, int]:
        """Each worker's current log length, to show later only what came after."""
        return {process.name: process.log_size() for process in self.processes}

    def logs(self, since: Optional[Dict[str, int]] = None) -> str:
        """Every worker's log (from the ``since`` offsets on, if given), under headers."""
        parts = []
        for process in self.processes:
            start = (since or {}).get(process.name, 0)
            parts.append(
                f"----- {process.name} ({process.log_path}) -----\n{process.log_text(start)}"
            )
        return "\n".join(parts)

    def __enter__(self) -> WorkerCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop(warm=False)


_failed_key = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Remember on the test item whether its setup or call failed."""
    outcome = yield
    report = outcome.get_result()
    if report.when in ("setup", "call") and report.failed:
        item.stash[_failed_key] = True


def node_failed(node: pytest.Item) -> bool:
    """Whether the setup or call phase of test ``node`` failed (for fixture teardown)."""
    return node.stash.get(_failed_key, False)


@pytest.fixture
def worker_cluster_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerClusterFactory]:
    """Start :class:`WorkerCluster` instances: ``factory(workers=3, concurrency=3, ...)``.

    Keyword arguments go to :class:`WorkerCluster`. The clusters are stopped when the
    test ends (killed: nothing is asked of them any more); if it failed, their workers'
    logs are printed first.
    """
    clusters: List[WorkerCluster] = []

    def factory(**options: object) -> WorkerCluster:
        log_directory = tmp_path_factory.mktemp("celery-workers")
        cluster = WorkerCluster(log_directory, **options)  # type: ignore[arg-type]
        cluster.start()  # stops what it started, and raises with the logs, if it fails
        clusters.append(cluster)
        return cluster

    yield factory
    failed = node_failed(request.node)
    for cluster in clusters:
        if failed:
            print(f"\n===== worker logs ({cluster.log_directory}) =====\n{cluster.logs()}")
        cluster.stop(warm=False)
        if not failed:
            shutil.rmtree(cluster.log_directory, ignore_errors=True)


@pytest.fixture
def start_workers(worker_cluster_factory: WorkerClusterFactory,
                  monkeypatch: pytest.MonkeyPatch) -> WorkerClusterFactory:
    """Start the workers of test app ``app_module`` (the client app made by its
    ``create_app``), ``environment`` set for them first (undone when the test ends); two
    workers of three processes unless ``options`` say otherwise (see :class:`WorkerCluster`)."""

    def start(app_module: str, environment: Mapping[str, str] = {},
              **options: Any) -> WorkerCluster:
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        options.setdefault("workers", 2)
        options.setdefault("concurrency", 3)
        return worker_cluster_factory(
            app_module=app_module,
            app_factory=importlib.import_module(app_module).create_app, **options)

    return start
