"""Checks shared by the end-to-end tests: what the task bodies recorded, and the lock store."""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List

import redis
from celery.result import AsyncResult, ResultSet

from celery_redislock import Semaphore
from celery_redislock.engine.parking_rate import DUE_RATE
from celery_redislock.engine.scripts import DUE
from celery_redislock.line.poll import POLL

if TYPE_CHECKING:
    from worker_cluster import WorkerCluster

#: Longest wait for a batch of tasks to finish (seconds).
RESULTS_TIMEOUT = 60.0

#: How long (s) a deadline move is in flight before the poll moves the next head of the
#: parking queue for a run still due (``LATE_HOLD_MS`` in ``deadline.lua``).
LATE_HOLD = int(re.search(r"LATE_HOLD_MS = (\d+)", (resources.files(
    "celery_redislock.engine") / "lua" / "deadline.lua").read_text()).group(1)) / 1000


def record_store(cluster: WorkerCluster) -> redis.Redis:
    """A client of the database where the task bodies record their runs."""
    assert cluster.urls is not None
    return redis.Redis.from_url(cluster.urls.record, decode_responses=True)


def lock_store(cluster: WorkerCluster) -> redis.Redis:
    """A client of the lock store's database."""
    assert cluster.urls is not None
    return redis.Redis.from_url(cluster.urls.lock)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.02) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_for_results(cluster: WorkerCluster, results: List[AsyncResult]) -> List[Any]:
    """The return values of ``results`` once all succeeded; fail on error, timeout, or
    when a worker process exits meanwhile."""
    pending = ResultSet(results, app=cluster.app)

    def all_ready() -> bool:
        cluster.check_running()
        return pending.ready()

    wait_until(all_ready, RESULTS_TIMEOUT, f"{len(results)} task results", interval=0.05)
    values = pending.join(timeout=RESULTS_TIMEOUT)
    assert [result.status for result in results] == ["SUCCESS"] * len(results)
    return values


def peaks(record: redis.Redis, key: str) -> List[int]:
    """How many bodies of ``key`` were running as each of them started."""
    return [int(value) for value in record.lrange(f"peaks:{key}", 0, -1)]


def assert_each_ran_once(record: redis.Redis, results: List[AsyncResult]) -> None:
    """Every task's body ran exactly once, however often it went back to the queue."""
    runs = {result.id: record.get(f"runs:{result.id}") for result in results}
    assert runs == {result.id: "1" for result in results}


def assert_failed_on_time(waiters: List[AsyncResult], sent: List[float], max_wait: float,
                          polls: LinePolls) -> None:
    """Each of ``waiters``, sent at ``sent`` (the host's clock, as the worker's result
    date), failed with ``LockWaitTimeout`` on time, judged by design, whatever the load;
    ``polls``: what the lock store ran of the workers' polls (:func:`line_polls`).

    * Never early: from its send to its failure as the worker stored it, and on the
      lock store's clock from its first refusal to its give-up (its message: "waited
      1.1 s parked behind ...", to 0.1 s), each waited at least ``max_wait`` (its
      deadline counts from its first refusal, after its send).
    * Late by no more than the mechanism makes it: the next poll after its deadline
      (every :data:`POLL` s, later on a loaded machine: the longest gap between two
      polls in the run is the figure) moves the head of its parking queue back to a
      worker, which asks and is told it gave up. That hop back (moved, delivered,
      asked) is a dispatch as a send is: the dispatch lag measured in the same run is
      the longest, over the waiters, of the time from a send to its stored failure that
      the store did not count (in: delivered, asked; out: to a pool process, its
      failure stored), with 0.1 s for the message's rounding. Two workers park the runs
      concurrently, so a copy may be queued just behind one whose deadline comes a
      little later: the poll moves that one first (it parks again, or gives up if due
      by then), and the due run is owed a move again at the next poll (not once the
      first move's hold, :data:`LATE_HOLD`, lapses: ``deadline.lua``): one more hop and
      one more gap between polls for each deadline move owed for it after the first,
      as counted in ``polls``.

    Sending many runs on a loaded machine takes a while, so the first ones may be due
    before the last ones are sent: each is judged from its own send."""
    assert [type(r.result).__name__ for r in waiters] == ["LockWaitTimeout"] * len(waiters)
    waited = [r.date_done.timestamp() - at for r, at in zip(waiters, sent)]
    told = [_waited_parked(r) for r in waiters]
    lag = max(total - store for total, store in zip(waited, told))
    end = max(r.date_done.timestamp() for r in waiters)
    during = sorted(at for at in polls.times if min(sent) <= at <= end)
    gap = max([POLL, *(b - a for a, b in zip(during, during[1:]))])
    again = [max(0, polls.holds_of(r.id) - 1) for r in waiters]
    print(f"\n{len(waiters)} parked runs failed {min(waited):.2f}-{max(waited):.2f} s after "
          f"each was sent; the store gave them up after {min(told):.1f}-{max(told):.1f} s "
          f"(max wait {max_wait} s; polls up to {gap:.2f} s apart, dispatch lag up to "
          f"{lag:.2f} s, deadline moves owed {sum(polls.holds.values())}, again "
          f"{sum(again)}; the sends took "
          f"{sent[-1] - sent[0]:.2f} s)")
    assert min(waited) >= max_wait, waited  # none gave up before its deadline
    assert min(told) >= max_wait, told
    assert len(during) >= 2, polls.times
    late = [(store, n) for store, n in zip(told, again)
            if store > max_wait + gap + lag + 0.1 + n * (lag + gap)]
    assert not late, (late, gap, lag)


def _waited_parked(result: AsyncResult) -> float:
    """How long the lock store said a run had waited when it gave it up (s, 0.1 s)."""
    found = re.search(r"waited (\d+\.\d) s parked", str(result.result))
    assert found, result.result
    return float(found.group(1))


def holders(cluster: WorkerCluster, name: str) -> int:
    """How many live leases the semaphore ``name`` has now."""
    return Semaphore(lock_store(cluster), name).holders()


def assert_slots_all_given_back(cluster: WorkerCluster, names: List[str]) -> None:
    """Every slot of the semaphores ``names`` was released (none is left to expire): a
    run's release goes with its process's next request to the lock store, or from its
    lease keeper within about 10 ms, so it may come moments after the run's result."""
    wait_until(lambda: all(holders(cluster, name) == 0 for name in names), 5,
               f"the slots of {names} to come back")


def slots_come_back(cluster: WorkerCluster, name: str) -> bool:
    """Wait until semaphore ``name`` has no holder (see :func:`assert_slots_all_given_back`)."""
    assert_slots_all_given_back(cluster, [name])
    return True


def assert_no_lease_lost(cluster: WorkerCluster) -> None:
    """No worker logged that a lease ran out while its task still ran."""
    assert "LEASE LOST" not in cluster.logs()


def server_time_us(client: redis.Redis) -> int:
    """The Redis server's clock, in microseconds (the clock the records use)."""
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)




@contextmanager
def lua_commands(cluster: WorkerCluster) -> Iterator[List[List[str]]]:
    """The commands the lock store's scripts ran during the block, each as its words, in
    the order the server ran them (read with MONITOR): what the scripts decided, however
    late loaded worker processes got round to acting on it. Filled when the block ends."""
    with _monitored(cluster, lambda event: event["client_type"] == "lua") as commands:
        yield commands


@contextmanager
def store_commands(cluster: WorkerCluster) -> Iterator[List[List[str]]]:
    """The commands clients sent to the lock store's database during the block (not
    those its scripts ran), each as its words, in the order the server ran them (read
    with MONITOR). Filled when the block ends."""
    assert cluster.urls is not None
    database = int(cluster.urls.lock.rsplit("/", 1)[1])
    with _monitored(cluster, lambda event: event["client_type"] != "lua"
                    and int(event["db"]) == database) as commands:
        yield commands


@dataclass
class LinePolls:
    """What the lock store ran of the parked lines' polls during a block (read with
    MONITOR; filled when the block ends): when each poll asked (``due.lua``,
    ``due_rate.lua``; the server's clock, s), and per run ('<task id>:<attempt>') how
    many deadline moves were owed for it (each puts its deadline :data:`LATE_HOLD`
    ahead while the move is in flight; ``deadline.lua``)."""

    times: List[float] = field(default_factory=list)
    holds: Dict[str, int] = field(default_factory=dict)

    def holds_of(self, task_id: str) -> int:
        return sum(n for run, n in self.holds.items() if run.startswith(task_id + ":"))


@contextmanager
def line_polls(cluster: WorkerCluster) -> Iterator[LinePolls]:
    """The parked lines' polls during the block (see :class:`LinePolls`)."""
    shas = {sha for script in (DUE, DUE_RATE) for sha in (script.sha, script.plain_sha)}

    def keep(event: Dict[str, Any]) -> bool:
        words = event["command"].split(maxsplit=3)
        if event["client_type"] == "lua":  # a deadline move owed: ZADD '..:pd..', HINCRBY 'd'
            return ((words[0] == "ZADD" and ":pd" in words[1])
                    or (words[0] == "HINCRBY" and words[2:3] == ["d"]))
        return words[0].upper() == "EVALSHA" and words[1] in shas

    polls = LinePolls()
    with _monitored(cluster, keep, lambda event: (
            event["time"], event["client_type"], event["command"].split())) as events:
        yield polls
    before: List[str] = []
    for at, kind, words in events:
        if kind != "lua":
            polls.times.append(at)
        elif words[0] == "HINCRBY" and before[:1] == ["ZADD"]:  # the same script's holds
            for member in before[3::2]:
                run = member.split("\x1f")[0]
                polls.holds[run] = polls.holds.get(run, 0) + 1
        if kind == "lua":
            before = words


@contextmanager
def _monitored(cluster: WorkerCluster, keep: Callable[[Dict[str, Any]], bool],
               entry: Callable[[Dict[str, Any]], Any] = lambda event: event["command"].split()
               ) -> Iterator[List[Any]]:
    """The commands the lock store's server ran during the block that ``keep`` keeps
    (given MONITOR's event), each as its ``entry`` (its words), in order. Filled when
    the block ends."""
    commands: List[Any] = []
    ready, end = threading.Event(), f"monitored-end-{id(commands)}"

    def watch() -> None:
        with lock_store(cluster).monitor() as monitor:
            ready.set()
            for event in monitor.listen():
                words = event["command"].split()
                if words[:2] == ["ECHO", end]:
                    return
                if keep(event):
                    commands.append(entry(event))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert ready.wait(10), "MONITOR did not start"
    try:
        yield commands
    finally:
        lock_store(cluster).echo(end)
        watcher.join(30)
        assert not watcher.is_alive(), "MONITOR did not end"
