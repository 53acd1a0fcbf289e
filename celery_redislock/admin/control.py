"""Change a limit while it runs: override its slots, pause it, resume it.

Operators (``celery redislock set-slots / pause / resume``) and task code write the
*control hashes* of a limit name; every admission reads them:

* ``set_slots(app, name, n)`` overrides the configured number of slots of semaphore
  ``name`` until :func:`clear_slots`. Raising it hands the new slots to waiting runs at
  once; lowering it never evicts a running holder: they finish, and runs are admitted
  again once fewer than ``n`` hold a slot.
* ``pause(app, name, seconds=...)`` (or ``until=...``, or neither: until
  :func:`resume`) refuses every run of ``name`` — its semaphore and its rate limiter —
  and sends them back to the queue to come back when the pause ends. Runs that hold a
  slot already are not touched.

Every call takes the Celery app (or a redis-py client of the lock store, then with
``prefix=`` if the app uses another ``redislock_key_prefix``; only with the app can
waiting runs be woken) and the limit's *name* — what the task's ``lock_key`` renders
to, the task name without one — or its full semaphore key.

After an upstream API answers 429, pause the key the task runs under::

    @app.task(bind=True, base=LimitedTask, lock_slots=4, lock_key="api:{token}")
    def call_api(self, token, payload):
        response = http.post(URL, json=payload, headers={"Authorization": token})
        if response.status_code == 429:
            pause_key_of(self, token,
                         seconds=int(response.headers.get("Retry-After", 30)),
                         keep_longer=True)
            raise self.retry(countdown=0)   # comes back once the pause ends
        ...

Times are on the Redis server's clock: ``seconds`` counts from the server's ``TIME``,
and ``until`` (a :class:`~datetime.datetime` or Unix seconds) is taken as a time of
that clock.
"""

from __future__ import annotations

import datetime
from typing import Any, List, Optional, Sequence, Tuple, Union

from ..config.limits_setting import config_limits, task_function
from ..config.settings import read_settings, redis_client
from ..engine.bounds import shown
from ..engine.holder import Holder
from ..engine.keys import (
    DEFAULT_PREFIX,
    RATE_CONTROL,
    SEMAPHORE,
    SEMAPHORE_CONTROL,
    companion_key,
    semaphore_key,
)
from ..engine.rate import Rate
from ..engine.scan import split_key
from ..engine.scripts import RELEASE_OWNER, LuaScript
from ..engine.semaphore import MAX_SLOTS, MIN_SLOTS
from ..errors import LockConfigurationError, RedisLockError
from ..gate.recovery import free_owner_slots
from ..line.handoff import wake_waiters
from ..run.limited import limits_of
from .state import FOREVER, LimitState, read_states

When = Union[datetime.datetime, float, int]

__all__ = [
    "LimitControlError",
    "LimitState",
    "clear_rate",
    "clear_slots",
    "limit_keys",
    "limit_state",
    "pause",
    "pause_key_of",
    "release_holder",
    "resume",
    "set_rate",
    "set_slots",
    "tasks_making",
]


class LimitControlError(RedisLockError, ValueError):
    """A control call was given something it cannot apply (bad count, a time that has
    passed, a task without limits); the message names the limit and the problem."""


_PAUSE = LuaScript.load("pause.lua", after=["control.lua"])
_OVERRIDE = LuaScript.load("override.lua", after=["control.lua"])


def limit_keys(name: str, prefix: str = DEFAULT_PREFIX) -> Tuple[str, str]:
    """The semaphore key and rate-limiter key of limit ``name`` (a name, or any of its
    Redis keys).

        >>> limit_keys("customer:42")
        ('redislock:{85280b862f4ca735}:s:customer:42', 'redislock:{85280b862f4ca735}:r:customer:42')
    """
    if not isinstance(name, str) or not name:
        raise LimitControlError(f"a limit name must be a non-empty string, not {name!r}")
    key = companion_key(name, SEMAPHORE) if split_key(name, prefix) else semaphore_key(name,
                                                                                     prefix)
    return key, companion_key(key, "r")


def _target(app_or_client: Any, prefix: Optional[str]) -> Tuple[Any, str, Any]:
    """(client, prefix, app or None) of a Celery app or a redis-py client."""
    if hasattr(app_or_client, "conf") and hasattr(app_or_client, "tasks"):
        settings = read_settings(app_or_client)
        return redis_client(app_or_client, settings), prefix or settings.prefix, app_or_client
    if not hasattr(app_or_client, "execute_command"):
        raise LimitControlError(
            f"expected a Celery app or a redis-py client, not {type(app_or_client).__name__}"
        )
    return app_or_client, prefix if prefix is not None else DEFAULT_PREFIX, None


def _wake(app: Any, key: str) -> int:
    """Hand free slots of ``key`` to its parked line (needs the app to move its runs)."""
    if app is None:
        return 0
    return wake_waiters(app, key)


def check_slots_value(slots: Any, name: str) -> int:
    """``slots`` as a slot count (an int from 1 to 1000000), or :class:`LimitControlError`.

        >>> check_slots_value("3", "crawl")
        3
    """
    if isinstance(slots, bool):
        slots = None
    try:
        count = int(slots)
        if isinstance(slots, float) and count != slots:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise LimitControlError(
            f"slots of {name!r} must be a whole number >= 1, not {shown(slots)}") from None
    if count < MIN_SLOTS:
        raise LimitControlError(f"slots of {name!r} must be >= {MIN_SLOTS}, not {count}")
    if count > MAX_SLOTS:
        raise LimitControlError(f"slots of {name!r} must be <= {MAX_SLOTS}, not {shown(count)}")
    return count


def set_slots(app_or_client: Any, name: str, slots: int, *,
              prefix: Optional[str] = None) -> int:
    """Override the number of slots of semaphore ``name`` until :func:`clear_slots`.

    Holders beyond a lowered count keep their slots and drain. Returns how many waiting
    runs were handed a new slot at once (always 0 with a client instead of the app).

        set_slots(app, "proj.tasks.crawl", 10)
        set_slots(app, "api:token-1", 1)         # what lock_key="api:{token}" renders
    """
    count = check_slots_value(slots, name)
    client, prefix, app = _target(app_or_client, prefix)
    key, _ = limit_keys(name, prefix)
    _OVERRIDE.run(client, [companion_key(key, SEMAPHORE_CONTROL)], ["set", "slots", str(count)])
    return _wake(app, key)


def clear_slots(app_or_client: Any, name: str, *, prefix: Optional[str] = None) -> bool:
    """Drop the override of :func:`set_slots`: the configured count applies again.
    Returns whether there was one.

        clear_slots(app, "proj.tasks.crawl")
    """
    client, prefix, app = _target(app_or_client, prefix)
    key, _ = limit_keys(name, prefix)
    removed = bool(_OVERRIDE.run(client, [companion_key(key, SEMAPHORE_CONTROL)],
                                 ["del", "slots"]))
    _wake(app, key)
    return removed


def release_holder(app_or_client: Any, name: str, holder: str, *,
                   prefix: Optional[str] = None) -> Holder:
    """Free one holder of semaphore ``name`` — ``holder`` is its token or a unique start
    of it — and hand the freed slot to its parked line (with the app; with a client
    instead, the slot is only freed). The run that held it is not stopped: free only a
    holder you know is dead. Returns the holder freed.

        release_holder(app, "customer:42", "celery@web1|5f0c")

    Raises :class:`LimitControlError` when no holder, or more than one, matches.
    """
    client, prefix, app = _target(app_or_client, prefix)
    key, _ = limit_keys(name, prefix)
    holders = read_states(client, [key], _now_ms(client), prefix=prefix)[0].holders
    found = _one_holder(holders, name, holder)
    if not _free_exactly(app, client, key, found.token):
        raise LimitControlError(f"holder {found.token!r} of {name!r} was already gone")
    return found


def _one_holder(holders: Sequence[Holder], name: str, holder: str) -> Holder:
    chosen = [h for h in holders if h.token == holder] or [
        h for h in holders if h.token.startswith(holder)
    ]
    if not chosen:
        raise LimitControlError(f"semaphore {name!r} has no holder {holder!r}")
    if len(chosen) > 1:
        tokens = ", ".join(h.token for h in chosen)
        raise LimitControlError(
            f"holder {holder!r} is ambiguous in semaphore {name!r}: it starts {tokens}"
        )
    return chosen[0]


def _free_exactly(app: Any, client: Any, key: str, token: str) -> int:
    """Free the holder whose token is ``token`` (a member starts with the token and a
    space), handing the slot over when there is an app to move a parked run."""
    if app is None:
        return int(RELEASE_OWNER.run(client, [key], [token + " ", 0])[0])
    return free_owner_slots(app, client, [key], token + " ")


def check_rate_value(rate: Any, name: str) -> Rate:
    """``rate`` (``"100/m"``, ``"10/s"``, ``"5/10s"``) as a :class:`Rate`, or
    :class:`LimitControlError`.

        >>> check_rate_value("100/m", "api").interval
        0.6
    """
    try:
        return Rate.parse(rate, owner=f"rate of {name!r}")
    except LockConfigurationError as exc:
        raise LimitControlError(str(exc)) from None


def set_rate(app_or_client: Any, name: str, rate: str, *,
             prefix: Optional[str] = None) -> None:
    """Override the rate of rate limiter ``name`` on every worker until
    :func:`clear_rate`: the next admission of every run under it, on any worker, uses
    ``rate`` (read inside the admission script, so at once); the burst stays the task's.
    The first admission under the new rate re-plans the starts promised under the old
    one (rescaled to the new rate, in the same atomic call), and the runs that hold them
    ask again within about a second, or a tenth of their wait: a raised rate speeds up
    the waiting backlog at once, a lowered one spreads it out.

        set_rate(app, "partner:acme", "100/m")
        set_rate(app, "proj.tasks.call_api", "5/s")    # what the task's lock_key renders
    """
    parsed = check_rate_value(rate, name)
    client, prefix, _ = _target(app_or_client, prefix)
    _, rate_key = limit_keys(name, prefix)
    _OVERRIDE.run(client, [companion_key(rate_key, RATE_CONTROL)],
                  ["set", "rate", str(rate).strip(), "interval", repr(parsed.interval * 1e6)])


def clear_rate(app_or_client: Any, name: str, *, prefix: Optional[str] = None) -> bool:
    """Drop the override of :func:`set_rate`: the configured rate applies again.
    Returns whether there was one.

        clear_rate(app, "partner:acme")
    """
    client, prefix, _ = _target(app_or_client, prefix)
    _, rate_key = limit_keys(name, prefix)
    return bool(_OVERRIDE.run(client, [companion_key(rate_key, RATE_CONTROL)],
                              ["del", "rate", "interval"]))


def _pause_arguments(name: str, until: Optional[When],
                     seconds: Optional[float]) -> Tuple[str, int]:
    if until is not None and seconds is not None:
        raise LimitControlError(f"pause of {name!r}: give until or seconds, not both")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not seconds > 0 or seconds == float("inf"):
            raise LimitControlError(
                f"pause of {name!r}: seconds must be a number > 0, not {seconds!r}")
        return "for", max(1, round(seconds * 1000))
    if until is None:
        return FOREVER, 0
    if isinstance(until, datetime.datetime):
        return "at", round(until.timestamp() * 1000)  # naive: the local time zone
    if isinstance(until, bool) or not isinstance(until, (int, float)) \
            or until != until or until in (float("inf"), float("-inf")):
        raise LimitControlError(
            f"pause of {name!r}: until must be a datetime or Unix seconds, not {until!r}")
    return "at", round(until * 1000)


def pause(app_or_client: Any, name: str, *, until: Optional[When] = None,
          seconds: Optional[float] = None, keep_longer: bool = False,
          prefix: Optional[str] = None) -> Optional[float]:
    """Refuse every run of limit ``name`` (semaphore and rate limiter) for ``seconds``,
    until ``until`` (datetime or Unix seconds, on the Redis server's clock), or, with
    neither, until :func:`resume`. Refused runs go back to the queue and come back when
    the pause ends; runs holding a slot are not touched.

    ``keep_longer=True`` leaves a pause already in force alone when it ends later (or
    never): what concurrent runs that all got a 429 want. Returns the end of the pause
    in force (Unix seconds, server clock), or None for a pause without an end.

        pause(app, "api:token-1", seconds=30)     # e.g. from a Retry-After header
        pause(app, "proj.tasks.crawl")             # until resume()
    """
    mode, value = _pause_arguments(name, until, seconds)
    client, prefix, _ = _target(app_or_client, prefix)
    key, rate = limit_keys(name, prefix)
    now, end = _PAUSE.run(client, [companion_key(key, SEMAPHORE_CONTROL),
                                   companion_key(rate, RATE_CONTROL)],
                          [mode, value, "1" if keep_longer else "0"])
    end = end.decode() if isinstance(end, bytes) else str(end)
    if end == "past":
        raise LimitControlError(
            f"pause of {name!r}: until {value / 1000:.3f} is not after the lock store's "
            f"time now ({int(now) / 1000:.3f}, Unix seconds)")
    return None if end == FOREVER else int(end) / 1000


def resume(app_or_client: Any, name: str, *, prefix: Optional[str] = None) -> bool:
    """End a pause of limit ``name`` now, and hand its free slots to waiting runs.
    Returns whether it was paused.

        resume(app, "api:token-1")
    """
    client, prefix, app = _target(app_or_client, prefix)
    key, rate = limit_keys(name, prefix)
    state = read_states(client, [key], _now_ms(client), prefix=prefix)[0]
    pipe = client.pipeline(transaction=False)
    pipe.hdel(companion_key(key, SEMAPHORE_CONTROL), "paused_until")
    pipe.hdel(companion_key(rate, RATE_CONTROL), "paused_until")
    pipe.execute()
    _wake(app, key)
    return state.paused


def limit_state(app_or_client: Any, name: str, *,
                prefix: Optional[str] = None) -> LimitState:
    """The state of limit ``name`` now: holders, reservations, its parked line,
    configured and overridden slots, pause.

        >>> state = limit_state(app, "proj.tasks.crawl")  # doctest: +SKIP
        >>> state.used, state.limit, state.waiting, state.paused  # doctest: +SKIP
        (2, 2, 0, False)
    """
    client, prefix, _ = _target(app_or_client, prefix)
    key, _ = limit_keys(name, prefix)
    return read_states(client, [key], _now_ms(client), prefix=prefix)[0]


def task_limit_names(task: Any, args: Sequence[Any] = (),
                     kwargs: Optional[dict] = None) -> List[str]:
    """The limit names a run of ``task`` with these arguments uses (its rendered
    ``lock_key`` s), in order, without repeats. Only the arguments the keys use are
    needed: ``("token-1",)`` for ``call_api(token, payload)`` under ``"api:{token}"``.

        task_limit_names(call_api, ("token-1",))   # ['api:token-1']
    """
    limits = limits_of(task) or config_limits(task.app, task.name, task_function(task))
    if limits is None:
        raise LimitControlError(f"task {task.name!r} has no celery-redislock limit")
    names: List[str] = []
    for rule in limits.rules:
        name = rule.key.render(tuple(args), dict(kwargs or {}), partial=True)
        if name not in names:
            names.append(name)
    return names


def tasks_making(app: Any, name: str) -> List[str]:
    """The registered tasks of ``app`` whose ``lock_key`` could give limit name ``name``
    (a template that matches it, or a key without arguments equal to it; a callable key
    cannot say), sorted.

        tasks_making(app, "customer:999")   # ['proj.sync_customer']
    """
    found = []
    for task_name, task in list(app.tasks.items()):
        try:
            limits = limits_of(task) or config_limits(app, task_name, task_function(task))
        except Exception:  # a broken limit: check_limits reports it
            continue
        if limits is not None and any(rule.key.could_render(name) for rule in limits.rules):
            found.append(task_name)
    return sorted(found)


def pause_key_of(task: Any, *args: Any, until: Optional[When] = None,
                 seconds: Optional[float] = None, keep_longer: bool = False,
                 **kwargs: Any) -> Optional[float]:
    """Pause the limit(s) that a run of ``task`` with ``args``/``kwargs`` uses: its
    ``lock_key`` rendered as for the run. Use it from a bound task's body (``self``)
    after an upstream 429; same ``until`` / ``seconds`` / ``keep_longer`` as
    :func:`pause`. Returns the end of the pause (Unix seconds), None for ever.

    Give the arguments the key uses, in the task's order or by name; the others may be
    left out (a key that needs one not given: :class:`~celery_redislock.LockKeyError`
    naming it)::

        # call_api(self, token, payload) under lock_key="api:{token}"
        pause_key_of(self, token, seconds=retry_after, keep_longer=True)
    """
    ends = [pause(task.app, name, until=until, seconds=seconds, keep_longer=keep_longer)
            for name in task_limit_names(task, args, kwargs)]
    if any(end is None for end in ends):
        return None
    return max(e for e in ends if e is not None)


def _now_ms(client: Any) -> int:
    seconds, microseconds = client.time()
    return int(seconds) * 1000 + int(microseconds) // 1000
