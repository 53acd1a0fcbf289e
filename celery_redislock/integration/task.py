"""``LimitedTask`` and ``SingletonTask``: Celery task classes whose runs are admitted first."""

from __future__ import annotations

import inspect
from typing import Any, List, Optional

from celery import Task

from ..config.limit import OPTION_DEFAULTS, RETRY_FIELDS, TaskLimits
from ..config.limits_setting import config_limits, task_function
from ..engine.keys import KeySource
from ..errors import LockConfigurationError
from ..gate.recovery import LIMITED_REQUEST, LIMITED_STRATEGY
from .unique import run_task, send_unique


class LimitedTask(Task):
    """A task of which at most ``lock_slots`` runs happen at once, across every worker.

    Example::

        @app.task(base=LimitedTask, lock_slots=2)
        def crawl(url): ...

        @app.task(base=LimitedTask, lock_slots=1, lock_key="customer:{customer_id}")
        def sync_customer(customer_id, full=False): ...

        @app.task(base=LimitedTask, lock_rate="10/s", lock_key="partner:{partner_id}")
        def ping_partner(partner_id): ...

    The run is admitted in the worker just before the body runs, and its slot given back
    when the body ends, however it ends. When it is not admitted the run goes back to the
    queue with a countdown (no worker process waits, and ``max_retries`` is not used up).

    ``lock_slots``             runs allowed at once per key, 1 to 1000000 (default 1, or
                               no slot limit when only ``lock_rate`` is given)
    ``lock_rate``              starts allowed per period per key, across every worker:
                               ``"10/s"``, ``"100/m"``, ``"5/10s"`` (default None); units
                               s, m, h, d, spelt out or not
    ``lock_burst``             starts allowed beyond the rate in any one period, 0 to
                               1000000 (default 1; 0 spaces every start a full interval)
    ``lock_key``               the key: a template over the task's argument names such as
                               ``"customer:{customer_id}"`` (``{api_token:hash}`` puts a
                               digest of the value instead of the value), or a callable
                               given the task's arguments by name; default the task's name.
                               Tasks naming the same key share its slots.
    ``lock_lease``             seconds a slot stays taken without renewal, 0.1 to 86400
                               (default 30); a running task renews it every third of that
    ``lock_cost``              slots of ``lock_slots`` one run takes and starts of
                               ``lock_rate`` it uses, all at once (default 1; at most
                               ``lock_slots`` and ``lock_burst + 1``), or a callable given
                               the task's arguments by name that returns it for each call
                               (a cost no run could start with then fails the run with
                               :class:`~celery_redislock.LockCostError`)
    ``lock_retry_backoff``     first countdown when no slot is free, 0 to 3600 s (default 1)
    ``lock_retry_backoff_max`` longest countdown, 0.05 to 3600 s (default 30)
    ``lock_retry_jitter``      spread countdowns randomly (default True)
    ``lock_max_wait``          give up after waiting this many seconds in all (0 to 30
                               days), failing the task with :class:`LockWaitTimeout`
                               (default None: never)
    ``lock_fair_by``           the parked line of ``lock_slots`` is served round-robin
                               across the keys this template gives the runs, e.g.
                               ``"tenant:{tenant}"`` (``redislock_line = "broker"``)
    ``lock_priority``          the band a run waits in on the parked line, 0 to 255,
                               higher first (default None: the message's ``priority``
                               in its broker's order: Redis serves 0 first, so p
                               waits as 9 - p; see :mod:`.priority`)
    ``lock_priority_aging``    seconds of waiting worth one step of priority (default 10)
    ``lock_unique``            ``True``: while a task of the same key is queued or running,
                               ``delay()``/``apply_async()`` return its result instead of
                               sending another; ``"raise"``: they raise
                               :class:`~celery_redislock.AlreadyQueued` (default None)
    ``lock_unique_lease``      seconds the unique lock lasts while queued (default 600)
    ``lock_period``            at most one run per key per period, e.g. ``"10m"``
    ``lock_period_mode``       ``"drop"`` (default) or ``"defer"`` runs within the period

    Any other ``lock_*`` attribute is refused as a misspelt option, and every problem of
    the definition is listed in one :class:`LockConfigurationError`: raised by
    ``delay()``, ``apply_async()`` and a run of the task, listed by
    :func:`~celery_redislock.check_limits`, and a worker does not start with it.

    An entry of the ``redislock_limits`` setting that matches the task replaces its
    ``lock_slots``, ``lock_rate``, ``lock_burst``, ``lock_key``, ``lock_lease`` and
    ``lock_cost``.
    Inside the body, ``self.request.redislock_lease`` is the :class:`Lease` held.
    """

    #: Frees the slots of a run whose pool child was lost, even when Celery requeues
    #: its message (see :class:`celery_redislock.gate.recovery.LimitedRequest`).
    Request = LIMITED_REQUEST
    #: Asks the limits in the worker's main process, before the pool: a run that waits
    #: never reaches a pool process (see :mod:`celery_redislock.gate.gate`).
    Strategy = LIMITED_STRATEGY
    _redislock_limited = True

    lock_slots: Optional[int] = OPTION_DEFAULTS["lock_slots"]
    lock_rate: Optional[str] = OPTION_DEFAULTS["lock_rate"]
    lock_burst: int = OPTION_DEFAULTS["lock_burst"]
    lock_key: KeySource = OPTION_DEFAULTS["lock_key"]
    lock_lease: float = OPTION_DEFAULTS["lock_lease"]
    lock_cost: Any = OPTION_DEFAULTS["lock_cost"]
    lock_retry_backoff: float = OPTION_DEFAULTS["lock_retry_backoff"]
    lock_retry_backoff_max: float = OPTION_DEFAULTS["lock_retry_backoff_max"]
    lock_retry_jitter: bool = OPTION_DEFAULTS["lock_retry_jitter"]
    lock_max_wait: Optional[float] = OPTION_DEFAULTS["lock_max_wait"]
    lock_fair_by: Optional[str] = OPTION_DEFAULTS["lock_fair_by"]
    lock_priority: Optional[int] = OPTION_DEFAULTS["lock_priority"]
    lock_priority_aging: float = OPTION_DEFAULTS["lock_priority_aging"]
    lock_unique: Any = OPTION_DEFAULTS["lock_unique"]
    lock_unique_lease: float = OPTION_DEFAULTS["lock_unique_lease"]
    lock_period: Any = OPTION_DEFAULTS["lock_period"]
    lock_period_mode: str = OPTION_DEFAULTS["lock_period_mode"]

    _redislock_own_limits: Optional[TaskLimits] = None
    _redislock_limits: Optional[TaskLimits] = None
    #: What is wrong with the task's options, if anything (see :meth:`__init__`).
    _redislock_definition_error: Optional[LockConfigurationError] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self).run is not Task.run:
            # Checked when the task is made. A mistake is kept, not raised here: Celery
            # makes tasks when the app is finalized, and an error then would break every
            # task of the app, deep in a traceback through Celery's proxies. It is
            # raised, short, by delay(), apply_async() and a run, and a worker refuses
            # to start with it (check_limits lists it).
            try:
                self._redislock_own_limits = self._own_limits()
            except LockConfigurationError as exc:
                self._redislock_definition_error = exc

    def definition_problems(self) -> List[str]:
        """What is wrong with this task's ``lock_*`` options, one sentence each (none:
        ``[]``); :func:`~celery_redislock.check_limits` and a starting worker list them.

            >>> from celery import Celery
            >>> app = Celery("proj", set_as_current=False)
            >>> @app.task(base=LimitedTask, lock_slot=2, name="proj.crawl")
            ... def crawl(url): ...
            >>> crawl.definition_problems()
            ["Task 'proj.crawl': unknown option lock_slot (did you mean lock_slots?)"]
        """
        error = self._redislock_definition_error
        return list(error.problems) if error is not None else []

    def _definition_error(self) -> Optional[LockConfigurationError]:
        """A new error saying what is wrong with the options (a new one each time, so
        its traceback is only that of the call that raises it), or None."""
        error = self._redislock_definition_error
        return None if error is None else LockConfigurationError(str(error), error.problems)

    def _task_name(self) -> str:
        return self.name or f"{type(self).__module__}.{type(self).__qualname__}"

    def _own_options(self, fields: Any) -> dict:
        return {name: self._option(f"lock_{name}") for name in fields}

    def _option(self, name: str) -> Any:
        value = getattr(self, name)
        if inspect.ismethod(value) and value.__self__ is self:
            # A callable lock_key given to app.task() is a class attribute, which Python
            # binds as a method: it is given the task's arguments, not the task.
            return value.__func__
        return value

    def _own_limits(self) -> TaskLimits:
        # Every lock_* attribute, so that a misspelt option (lock_slot=2) is refused.
        options = {name[len("lock_"):]: self._option(name)
                   for name in dir(type(self)) if name.startswith("lock_")}
        return TaskLimits.compile(
            self._task_name(), self.run, [options], default_slots=1, option_prefix="lock_",
        )

    def task_limits(self) -> TaskLimits:
        """The limits this task runs under: a ``redislock_limits`` entry, else its options
        (:class:`LockConfigurationError` when they are wrong)."""
        error = self._definition_error()
        if error is not None:
            raise error from None
        if self._redislock_limits is None:
            from_config = config_limits(
                self._get_app(), self._task_name(), task_function(self),
                retry_defaults=self._own_options(RETRY_FIELDS),
            )
            self._redislock_limits = (
                from_config or self._redislock_own_limits or self._own_limits()
            )
        return self._redislock_limits

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            # A plain function call, not an execution by Celery: no limit, like rate_limit.
            return super().__call__(*args, **kwargs)
        # The tracer has pushed this run's request already: call the body directly, as
        # Celery's worker does, so that apply() and eager runs see the right request.
        return run_task(self, self.task_limits(), args, kwargs,
                        lambda: self.run(*args, **kwargs), request)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``delay``: ``apply_async(args, kwargs)``. A task whose options are
        wrong raises :class:`LockConfigurationError` here, saying what to fix."""
        error = self._definition_error()
        if error is not None:
            raise error from None
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Celery's ``apply_async``; with ``lock_unique``, a task whose key is queued or
        running already is not sent again (see :mod:`celery_redislock.integration.unique`).
        A task whose options are wrong raises :class:`LockConfigurationError`."""
        error = self._definition_error()
        if error is not None:
            raise error from None
        unique = self.task_limits().unique
        if unique is None:
            return super().apply_async(args, kwargs, **options)
        return send_unique(self, unique, super().apply_async, args, kwargs, options)


class SingletonTask(LimitedTask):
    """A task of which at most one run happens at a time across the cluster.

    Example::

        @app.task(base=SingletonTask)
        def rebuild_index(): ...

        @app.task(base=SingletonTask, lock_key="report:{account_id}")
        def build_report(account_id): ...   # one at a time per account

    The same as ``LimitedTask`` with ``lock_slots=1``, which it does not let you change.
    """

    def _own_limits(self) -> TaskLimits:
        if self.lock_slots not in (None, 1):
            raise LockConfigurationError(
                f"Task {self._task_name()!r}: a SingletonTask has exactly one slot; "
                f"use LimitedTask for lock_slots={self.lock_slots!r}"
            )
        self.lock_slots = 1
        return super()._own_limits()
