"""The Celery app of the task-overhead benchmark, loaded both by the worker and the sender.

Every URL comes from the environment, so the benchmark can point it at its private
redis-server:

``REDISLOCK_BENCH_BROKER_URL``    broker
``REDISLOCK_BENCH_BACKEND_URL``   result backend
``REDISLOCK_BENCH_LOCK_URL``      lock store (``redislock_url``), also holds the counters
``REDISLOCK_BENCH_IGNORE_RESULT`` ``"1"`` (default): tasks store no result; ``"0"``: they do
``REDISLOCK_BENCH_PROFILE_DIR``   if set, each worker child profiles itself (cProfile)
                                  and writes ``<pid>.prof`` there when it exits
``REDISLOCK_BENCH_PROFILE_CLOCK`` the profiler's clock: ``wall`` (default), ``process``
                                  (CPU of the whole child, every thread) or ``thread``
                                  (CPU of the thread that runs the tasks)

Both tasks do nothing. A finished task is counted by a ``task_postrun`` handler (so a
limited task's count comes after its slot is given back) with one ``INCR`` of
``bench:done:<task name>`` in the lock store.

Three more no-op tasks measure floors (``--floors``): ``bench.round_trip`` makes one
round trip to the lock store, over the same kind of connection a limited run uses;
``bench.script_call`` makes the Redis calls of a limited run with the same arguments and
replies, but its script only reads the server's clock (what sending a script call and
its release costs, apart from the admission's own work in Redis); and
``bench.bare_admission`` makes exactly the Redis calls of a limited run (the admission
script, then the release sent with the next request) with none of the package's code
around them. What a limited run costs beyond the bare admission is the package's own.
"""

from __future__ import annotations

import cProfile
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis
from celery import Celery, Task
from celery.signals import task_postrun, worker_process_init, worker_process_shutdown

from celery_redislock import LimitedTask
from celery_redislock.engine.admission import CONTENDED, SlotLimit, milliseconds, new_token
from celery_redislock.engine.channel import channel_for
from celery_redislock.engine.holder import holder_member
from celery_redislock.engine.scripts import ADMIT, LuaScript

BROKER_ENV = "REDISLOCK_BENCH_BROKER_URL"
BACKEND_ENV = "REDISLOCK_BENCH_BACKEND_URL"
LOCK_ENV = "REDISLOCK_BENCH_LOCK_URL"
IGNORE_RESULT_ENV = "REDISLOCK_BENCH_IGNORE_RESULT"
PROFILE_ENV = "REDISLOCK_BENCH_PROFILE_DIR"
PROFILE_CLOCK_ENV = "REDISLOCK_BENCH_PROFILE_CLOCK"
PROFILE_CLOCKS: Dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,
    "process": time.process_time,
    "thread": time.thread_time,
}

QUEUE = "redislock-bench"
PLAIN = "bench.plain"
LIMITED = "bench.limited"
ROUND_TRIP = "bench.round_trip"
SCRIPT_CALL = "bench.script_call"
BARE_ADMISSION = "bench.bare_admission"
#: Far more slots than the worker has processes: the limited task is never contended.
LIMITED_SLOTS = 1000
COUNTED = (PLAIN, LIMITED, ROUND_TRIP, SCRIPT_CALL, BARE_ADMISSION)


def counter_key(task_name: str) -> str:
    """The Redis key that counts finished runs of ``task_name``."""
    return f"bench:done:{task_name}"


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"environment variable {name} is not set")
    return value


app = Celery(
    "redislock_bench",
    broker=_required_env(BROKER_ENV),
    backend=_required_env(BACKEND_ENV),
)
app.conf.update(
    redislock_url=_required_env(LOCK_ENV),
    task_ignore_result=os.environ.get(IGNORE_RESULT_ENV, "1") == "1",
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name=PLAIN)
def plain() -> None:
    """A task that does nothing."""


@app.task(name=LIMITED, base=LimitedTask, lock_slots=LIMITED_SLOTS)
def limited() -> None:
    """A task that does nothing, inside a slot of a never-full semaphore."""


@app.task(name=ROUND_TRIP)
def round_trip() -> None:
    """One ``PING`` to the lock store over this process's channel, as runs use."""
    channel_for(_counter()).call("PING")


_BARE_LIMIT = SlotLimit(BARE_ADMISSION, LIMITED_SLOTS, "redislock:")
_BARE_DESCRIPTION = (
    '{"task": "bench.bare_admission", "worker": "bench@host", "pid": 12345, '
    '"id": "00000000-0000-0000-0000-000000000000"}'
)
_bare_arguments: Optional[Tuple[int, List[Any]]] = None


def _admission_arguments() -> Tuple[int, List[Any]]:
    """The lease (ms), and the admission script's arguments after the description, as
    the limited task's runs pass them (worked out on the first run)."""
    global _bare_arguments
    if _bare_arguments is None:
        limits = app.tasks[LIMITED].task_limits()
        _bare_arguments = (milliseconds(limits.lease), [_BARE_LIMIT.spec({})])
    return _bare_arguments


#: A script with the admission's arguments and the shape of its reply that only reads
#: the server's clock (``clock_only.lua``, beside this file).
_CLOCK_ONLY = LuaScript(
    "clock_only.lua", (Path(__file__).parent / "clock_only.lua").read_text("utf-8"))


@app.task(name=SCRIPT_CALL)
def script_call() -> None:
    """The script call and the release a limited run sends, with the same arguments
    and reply, to a script that only reads the clock: the cost of the calls apart from
    the admission's own work in Redis."""
    _admit_and_release(_CLOCK_ONLY)


@app.task(name=BARE_ADMISSION)
def bare_admission() -> None:
    """The admission script and the release a limited run sends, with no package code
    around them: the Redis work of a limited run on its own."""
    _admit_and_release(ADMIT)


def _admit_and_release(script: LuaScript) -> None:
    """Call ``script`` as a limited run calls the admission script, then send the
    release it would send, to go with the next request."""
    client = _counter()
    token = new_token()
    lease_ms, rest = _admission_arguments()
    reply = script.run(client, [_BARE_LIMIT.key],
                       [token, lease_ms, _BARE_DESCRIPTION, *rest])
    now_ms, _, fence, _, _ = reply.split()
    member = holder_member(token, int(now_ms), int(fence), _BARE_DESCRIPTION)
    channel_for(client).send(("ZREM", _BARE_LIMIT.key, member),
                             ("ZSCORE", _BARE_LIMIT.key, CONTENDED), then=_ignore, now=False)


def _ignore(replies: Any) -> None:
    """The release's answer is not needed here: nobody waits for this semaphore."""


_counter_client: Optional[redis.Redis] = None
_profiler: Optional[cProfile.Profile] = None


def _counter() -> redis.Redis:
    """This process's client of the lock store, made on first use (after any fork)."""
    global _counter_client
    if _counter_client is None:
        _counter_client = redis.Redis.from_url(_required_env(LOCK_ENV))
    return _counter_client


@task_postrun.connect
def count_finished(sender: Optional[Task] = None, **_: Any) -> None:
    """Count one finished run of the task that just ran."""
    if sender is not None and sender.name in COUNTED:
        _counter().incr(counter_key(sender.name))


@worker_process_init.connect
def start_profiling(**_: Any) -> None:
    """In profiling mode, profile this worker child from its start."""
    global _profiler
    if os.environ.get(PROFILE_ENV):
        clock = PROFILE_CLOCKS[os.environ.get(PROFILE_CLOCK_ENV, "wall")]
        _profiler = cProfile.Profile(clock)
        _profiler.enable()


@worker_process_shutdown.connect
def stop_profiling(**_: Any) -> None:
    """In profiling mode, write this worker child's profile as it exits."""
    directory = os.environ.get(PROFILE_ENV)
    if _profiler is not None and directory:
        _profiler.disable()
        _profiler.dump_stats(str(Path(directory) / f"{os.getpid()}.prof"))
