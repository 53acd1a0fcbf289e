"""Exceptions raised by celery-redislock: the lowest layer, which every other layer may
import and which imports nothing of the package."""

from __future__ import annotations

from typing import Sequence, Tuple


class RedisLockError(Exception):
    """Base class of every error this package raises."""


class LockConfigurationError(RedisLockError, ValueError):
    """A limit is configured wrongly: found when the task is made, and raised by its
    ``delay()`` / ``apply_async()`` and by :func:`~celery_redislock.check_limits`; a
    worker refuses to start with it (one line per problem), so no worker runs it.

    The message names the task (or setting) and the problem, for example::

        Task 'proj.tasks.sync': lock_key 'customer:{custmer_id}' names argument
        'custmer_id', which the task does not take (it takes: customer_id, full)

    A definition with several problems raises one error listing them all, one a line;
    ``problems`` holds them one by one (one item when there is one problem).
    """

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems: Tuple[str, ...] = tuple(problems) or (message,)

    @classmethod
    def listing(cls, owner: str, problems: Sequence[str]) -> LockConfigurationError:
        """One error for every problem of ``owner``: the problem itself when there is one.

            >>> error = LockConfigurationError.listing("Task 't'", ["a", "b"])
            >>> str(error).splitlines(), error.problems
            (["Task 't' has 2 problems:", '  - a', '  - b'], ('a', 'b'))
        """
        if len(problems) == 1:
            return cls(problems[0])
        return cls(f"{owner} has {len(problems)} problems:\n  - " + "\n  - ".join(problems),
                   problems)


class LockKeyError(RedisLockError):
    """The semaphore name could not be built from a task's arguments at run time."""


class LockCostError(LockKeyError):
    """A run's cost (``lock_cost`` given as a callable of the task's arguments) could not
    be worked out at run time, or is one no run could ever be admitted with: not a whole
    number from 1, or above the slots (or the burst + 1) of its limit. The task fails
    with it, before it takes anything; the message names the task, the callable and the
    value, for example::

        Task 'proj.tasks.export': lock_cost export_cost() gave 7 for this call, above
        lock_slots 4: the run could never be admitted
    """


class LockWaitTimeout(RedisLockError):
    """A task waited longer than its ``lock_max_wait`` for a free slot and gave up.

    The task fails with this exception; its message names the task, the semaphore and
    how long it waited.
    """


class LockTimeout(RedisLockError):
    """A blocking :meth:`Semaphore.acquire` used as a context manager found no free slot in time."""


class LockStoreUnavailable(RedisLockError):
    """The Redis server that holds the semaphores could not be reached."""


class LockStoreFull(LockStoreUnavailable):
    """The lock store refused a write because it is full: it reached ``maxmemory`` under
    the ``noeviction`` policy (the server's ``OOM`` error). Runs fail closed: they wait,
    as for an outage, until memory is freed or ``maxmemory`` raised.

    The message names the task and carries the server's own message, for example::

        Task 'proj.tasks.sync': the lock store is full: OOM command not allowed when
        used memory > 'maxmemory'.
    """


class LockStoreRefused(LockStoreUnavailable):
    """The lock store answered but refused the package's command: a configuration
    problem, not an outage (a wrong password, an ACL user lacking a command or key, a
    command the server does not have, a Redis older than 6.2, a script error). A worker
    refuses to start with it; at run time runs wait and each refusal is logged as an
    error with the server's message.
    """


class AlreadyQueued(RedisLockError):
    """A task with ``lock_unique="raise"`` was sent while a task of the same key is queued
    or running.

    ``key`` is the unique key (the task's rendered ``lock_key``), ``task_id`` the id of the
    task queued or running, ``task_name`` the task's name::

        try:
            build_report.delay(7)
        except AlreadyQueued as exc:
            print(exc.key, exc.task_id)      # report:7 4f1c...
    """

    def __init__(self, key: str, task_id: str, task_name: str = "") -> None:
        self.key = key
        self.task_id = task_id
        self.task_name = task_name
        super().__init__(key, task_id, task_name)

    def __str__(self) -> str:
        task = f"Task {self.task_name!r}: " if self.task_name else ""
        return (f"{task}a task of unique key {self.key!r} is queued or running already: "
                f"{self.task_id}")
