"""``celery redislock``: look at, repair and steer an app's limits from the shell.

Registered as a Celery subcommand (entry point group ``celery.commands``), so it runs
against the app given with ``-A`` and the lock store its ``redislock_*`` settings name::

    celery -A proj redislock status            # every key: used/limit, waiting, paused
    celery -A proj redislock status --json     # the same, machine-readable
    celery -A proj redislock inspect crawler   # holders and waiting line of "crawler"
    celery -A proj redislock release crawler w1@host|task-1|  # free one holder
    celery -A proj redislock reap              # drop holder entries whose lease ran out
    celery -A proj redislock set-slots crawler 5   # override the slot count
    celery -A proj redislock clear-slots crawler   # back to the configured count
    celery -A proj redislock set-rate partner:acme 100/m   # override the rate
    celery -A proj redislock clear-rate partner:acme       # back to the configured rate
    celery -A proj redislock pause api:t1 --for 30s  # refuse every run for 30 s
    celery -A proj redislock resume api:t1
    celery -A proj redislock watch             # live view

Every age, lease and pause is measured on the Redis server's clock (``TIME``), the clock
the leases themselves are written in.

Errors (unknown key, bad number or time, unknown or ambiguous holder, Redis
unreachable, broken settings) print one line on stderr and exit with status 1.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import json
import re
import string
from dataclasses import asdict, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import click
from redis.exceptions import RedisError

from ..config.limits_setting import config_limits, task_function
from ..config.settings import read_settings, redis_client
from ..engine.holder import Holder
from ..engine.keys import (
    LINE,
    RATE,
    RATE_CONTROL,
    SEMAPHORE,
    SEMAPHORE_CONTROL,
    companion_key,
    semaphore_key,
)
from ..engine.refusal import eviction_warning
from ..engine.scan import batches, limit_semaphore_keys, split_key
from ..errors import RedisLockError
from ..integration.recovery import limits_of
from ..integration.task import SingletonTask
from . import control
from .state import LimitState, Waiter, pause_text, read_states, span
from .watch import run_watch

STATUS_SCHEMA = """\
JSON schema of `status --json`: a list with one object per key:
{"key": str, "name": str, "holders": int, "reserved": int, "used": int,
 "limit": int or null, "configured_limit": int or null,
 "slots_override": int or null, "waiting": int, "paused": bool,
 "paused_until": float or null, "pause_left_seconds": float or null,
 "contended": bool, "oldest_age_seconds": float or null,
 "rate_limiter": bool, "rate": str or null, "rate_override": str or null}.
"used" = the slots of live "holders" + "reserved" (slots kept for waiters);
"holders" counts runs, a weighted run (lock_cost) using several slots; "limit" is the
count admission applies now: "slots_override" if set, else "configured_limit"
(null when unknown); "paused_until" is Unix seconds on the Redis server's clock,
null when not paused or paused until resumed; "rate_limiter" is true when the
name has a rate limiter's state in Redis, "rate" its configured rate when a
registered task gives it."""


def semaphore_name(key: str, prefix: str) -> str:
    """The readable name in a semaphore's key (cut names end with ``~``).

        >>> semaphore_name("redislock:{85280b862f4ca735}:s:customer:42", "redislock:")
        'customer:42'
    """
    split = split_key(key, prefix)
    return split[1] if split else key


def task_rules(app: Any) -> Iterable[Tuple[Any, Any]]:
    """(task, rule) of every limit rule of the app's registered tasks."""
    for name, task in list(app.tasks.items()):
        try:
            limits = limits_of(task) or config_limits(app, name, task_function(task))
        except Exception:  # a broken limit: `celery check_limits`'s business, not ours
            continue
        if limits is None:
            continue
        for rule in limits.rules:
            yield task, rule


def _constant_rules(app: Any) -> Iterable[Tuple[str, Any]]:
    """(name, rule) of every limit rule of the app's tasks whose key does not depend on
    the task's arguments."""
    for _, rule in task_rules(app):
        if rule.key.is_constant:
            yield rule.key.render((), {}), rule


def name_pattern(rule: Any) -> Optional[re.Pattern]:
    """A pattern matching every name ``rule``'s key can render (None for a callable key).

        >>> from celery_redislock.config.limit import TaskLimits
        >>> def report(account_id): ...
        >>> rule = TaskLimits.compile("proj.report", report,
        ...                           [{"slots": 1, "key": "report:{account_id}"}]).rules[0]
        >>> bool(name_pattern(rule).match("report:42")), bool(name_pattern(rule).match("x"))
        (True, False)
    """
    source = rule.key.source
    if source is None:
        return re.compile(re.escape(rule.key.render((), {})) + r"\Z")
    if not isinstance(source, str):
        return None
    parts = [re.escape(literal) + ("" if field is None else ".+")
             for literal, field, _, _ in string.Formatter().parse(source)]
    return re.compile("".join(parts) + r"\Z")


def singleton_tasks(app: Any, name: str) -> List[str]:
    """The ``SingletonTask`` tasks of ``app`` whose limit name may be ``name``."""
    found = []
    for task, rule in task_rules(app):
        pattern = name_pattern(rule) if isinstance(task, SingletonTask) else None
        if pattern is not None and pattern.match(name):
            found.append(task.name)
    return sorted(set(found))


def known_rates(app: Any, names: Iterable[str]) -> Dict[str, str]:
    """The configured rate of each of ``names`` that a registered task's rule gives."""
    rules = [(name_pattern(rule), rule.rate) for _, rule in task_rules(app)
             if rule.rate is not None]
    found: Dict[str, str] = {}
    for name in names:
        rates = {str(rate) for pattern, rate in rules if pattern and pattern.match(name)}
        if len(rates) == 1:
            found[name] = rates.pop()
    return found


def known_limits(app: Any, prefix: str) -> Dict[str, int]:
    """Slot counts of the semaphore keys that registered tasks use whatever their
    arguments: ``{key: slots}``. A key two tasks give different counts is left out.

        >>> from celery import Celery
        >>> from celery_redislock import LimitedTask
        >>> app = Celery("proj", set_as_current=False)
        >>> @app.task(base=LimitedTask, lock_slots=2, name="proj.crawl")
        ... def crawl(): ...
        >>> known_limits(app, "redislock:") == {semaphore_key("proj.crawl"): 2}
        True
    """
    found: Dict[str, set] = {}
    for name, rule in _constant_rules(app):
        if rule.slots is not None:
            found.setdefault(semaphore_key(name, prefix), set()).add(rule.slots)
    return {key: next(iter(slots)) for key, slots in found.items() if len(slots) == 1}


def registered_keys(app: Any, prefix: str) -> Set[str]:
    """Semaphore keys of the names that registered tasks use whatever their arguments
    (with a slot limit, a rate, or both)."""
    return {semaphore_key(name, prefix) for name, _ in _constant_rules(app)}


class LockStore:
    """The lock store of a Celery app: its settings, client and server clock.

        store = LockStore(app)
        for state in store.states(store.limit_keys(), store.now_ms()):
            print(state.name, state.used, state.limit)
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.settings = read_settings(app)
        self.prefix = self.settings.prefix
        self.client = redis_client(app, self.settings)

    def now_ms(self) -> int:
        """The Redis server's time, in ms."""
        seconds, microseconds = self.client.time()
        return int(seconds) * 1000 + int(microseconds) // 1000

    def limit_keys(self) -> List[str]:
        """The semaphore key of every name with a semaphore, a waiting line, a rate
        limiter or a control hash under the app's prefix, sorted."""
        return limit_semaphore_keys(self.client, self.prefix,
                                    marks=(SEMAPHORE, LINE, SEMAPHORE_CONTROL, RATE,
                                           RATE_CONTROL))

    def states(self, keys: List[str], now: int, waiters: Optional[int] = 0,
               limits: Optional[Dict[str, int]] = None) -> List[LimitState]:
        """The state of each key, in batches; ``limits`` (``{key: slots}``) fills in the
        configured count of keys no admission recorded one for."""
        found: List[LimitState] = []
        for batch in batches(keys, 200):
            found.extend(read_states(self.client, batch, now, prefix=self.prefix,
                                     waiters=waiters))
        if limits:
            found = [replace(s, configured_slots=limits[s.key])
                     if s.configured_slots is None and s.key in limits else s for s in found]
        return found

    def key_of(self, name: str, *, force: bool = False) -> str:
        """The semaphore key of limit ``name`` (a name, or one of its full keys).

        Raises :class:`click.ClickException` when Redis has nothing of that name (no
        semaphore, waiting line, rate limiter or control hash) and no registered task's
        key makes it (a template such as ``customer:{customer_id}`` makes
        ``customer:999``), unless ``force``.
        """
        key, _ = control.limit_keys(name, self.prefix)
        if force or key in registered_keys(self.app, self.prefix) \
                or control.tasks_making(self.app, name):
            return key
        pipe = self.client.pipeline(transaction=False)
        for mark in ("s", LINE, SEMAPHORE_CONTROL, RATE, RATE_CONTROL):
            pipe.exists(companion_key(key, mark))
        if not any(pipe.execute()):
            raise click.ClickException(
                f"no limit named {name!r} in the lock store (no key {key} or its companions) "
                f"and no registered task's lock_key makes it{self.did_you_mean(name)}; "
                "--force acts on it all the same"
            )
        return key

    def did_you_mean(self, name: str) -> str:
        """``" (did you mean 'x'?)"`` with the closest known names, or ``""``."""
        known = {semaphore_name(key, self.prefix) for key in self.limit_keys()}
        known.update(name for name, _ in _constant_rules(self.app))
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        if not close:
            return ""
        return " (did you mean " + ", ".join(repr(found) for found in close) + "?)"

    def holders(self, key: str, minimum_ms: float = 0) -> List[Holder]:
        """Holder entries of ``key`` whose lease ends after ``minimum_ms``, oldest first."""
        state = read_states(self.client, [key], self.now_ms(), prefix=self.prefix)[0]
        return [h for h in state.holders if h.lease_end_ms > minimum_ms]


def _cli_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn Redis and configuration errors into a one-line message and exit status 1."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except RedisError as exc:
            raise click.ClickException(
                f"lock store Redis failed: {type(exc).__name__}: {_one_line(exc)}"
            ) from exc
        except RedisLockError as exc:
            raise click.ClickException(_one_line(exc)) from exc

    return run


def _store(ctx: click.Context) -> LockStore:
    from celery.bin.base import CLIContext

    obj = ctx.find_object(CLIContext)
    if obj is None or obj.app is None:
        raise click.ClickException("no Celery app: run as `celery -A proj redislock ...`")
    load_task_modules(obj.app)
    return LockStore(obj.app)


def load_task_modules(app: Any) -> None:
    """Import the app's task modules as ``celery worker`` does (``include``, ``imports``,
    ``autodiscover_tasks()``), so that every task's limits are known here too."""
    try:
        app.loader.import_default_modules()
    except Exception as exc:
        raise click.ClickException(
            f"could not import the app's task modules: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc


@click.group(name="redislock")
def redislock() -> None:
    """Look at, repair and steer the celery-redislock limits of the app (-A).

    Ages, leases and pauses are timed by the Redis server's clock.
    """


def status_rows(store: LockStore) -> List[Dict[str, Any]]:
    """One ``status --json`` row per key of the lock store (see :data:`STATUS_SCHEMA`)."""
    return [row for _, row in status_entries(store)]


def status_entries(store: LockStore) -> List[Tuple[LimitState, Dict[str, Any]]]:
    """(state, ``status --json`` row) of every name the lock store has anything of."""
    now = store.now_ms()
    limits = known_limits(store.app, store.prefix)
    states = [state for state in store.states(store.limit_keys(), now, limits=limits)
              if state.exists or state.active or state.rate_limiter]
    rates = known_rates(store.app, [state.name for state in states])
    return [(state, status_row(state, rates.get(state.name))) for state in states]


def status_row(state: LimitState, rate: Optional[str] = None) -> Dict[str, Any]:
    """The ``status --json`` row of one key; ``rate`` is its configured rate, if known."""
    now = state.server_time_ms
    live = state.live_holders
    return {
        "key": state.key,
        "name": state.name,
        "holders": len(live),
        "reserved": sum(reservation.cost for reservation in state.reservations),
        "used": state.used,
        "limit": state.limit,
        "configured_limit": state.configured_slots,
        "slots_override": state.slots_override,
        "waiting": state.waiting,
        "paused": state.paused,
        "paused_until": None if state.paused_until_ms is None else state.paused_until_ms / 1000,
        "pause_left_seconds": (None if state.pause_left is None
                               else round(state.pause_left, 3)),
        "contended": state.contended,
        "oldest_age_seconds": round(max(h.age(now) for h in live), 3) if live else None,
        "rate_limiter": state.rate_limiter,
        "rate": rate,
        "rate_override": state.rate_override,
    }


@redislock.command(help="List every key: slots used/limit, configured limit and override, "
                        "waiting runs, pause, oldest holder age.\n\n\b\n" + STATUS_SCHEMA)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema below).")
@click.pass_context
@_cli_errors
def status(ctx: click.Context, as_json: bool) -> None:
    store = _store(ctx)
    entries = status_entries(store)
    rows = [row for _, row in entries]
    warning = eviction_warning(store.client)
    if warning:
        click.echo(f"WARNING: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no limits in the lock store")
        return
    _table(["NAME", "USED", "CONFIGURED", "OVERRIDE", "WAITING", "PAUSED", "CONTENDED",
            "OLDEST", "RATE"], [
        [row["name"], f"{row['used']}/{_or(row['limit'], '?')}",
         _or(row["configured_limit"], "?"), _or(row["slots_override"], "-"),
         str(row["waiting"]), pause_text(state),
         "yes" if row["contended"] else "no",
         "-" if row["oldest_age_seconds"] is None else f"{row['oldest_age_seconds']:.1f}s",
         _rate_text(row)]
        for state, row in entries
    ])


@redislock.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@_cli_errors
def inspect(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show the holders and waiting line of limit NAME (its name, or its full key).

    Entries whose lease ran out but are not yet removed are shown as expired. Waiters
    are listed in line order: position 0 gets the next free slot.

    \b
    With --json: {"key": str, "name": str, "used": int, "limit": int|null,
    "configured_limit": int|null, "slots_override": int|null, "paused": bool,
    "paused_until": float|null, "pause_left_seconds": float|null,
    "holders": [{"token": str, "task_id": str|null, "task": str|null,
      "worker": str|null, "pid": int|null, "age_seconds": float,
      "lease_left_seconds": float, "fence": int, "expired": bool, "cost": int}],
    "reservations": [{"ticket": str, "left_seconds": float, "cost": int}],
    "waiting": int,
    "waiters": [{"position": int, "ticket": str, "task": str|null,
      "task_id": str|null, "worker": str|null, "age_seconds": float,
      "reserved": bool}]}.
    """
    store = _store(ctx)
    key = store.key_of(name)
    now = store.now_ms()
    state = store.states([key], now, waiters=None, limits=known_limits(store.app,
                                                                        store.prefix))[0]
    if as_json:
        click.echo(json.dumps(inspect_json(state), indent=2))
        return
    _echo_inspect(state, key, now)


def _echo_inspect(state: LimitState, key: str, now: int) -> None:
    """``inspect``'s text: the limit, its holders, reservations and waiting line."""
    live = len(state.live_holders)
    click.echo(f"{state.name} ({key}): {live} live holder(s), "
               f"{state.used}/{_or(state.limit, '?')} slots used, {state.waiting} waiting")
    click.echo("slots: " + ", ".join(_limit_words(state)))
    if state.holders:
        _echo_holders(state.holders, now)
    for reservation in state.reservations:
        slots = f"{reservation.cost} slots" if reservation.cost > 1 else "a slot"
        click.echo(f"{slots} reserved for waiter {reservation.ticket}: "
                   f"{(reservation.until_ms - now) / 1000:.1f}s left")
    if state.waiters:
        click.echo("waiting line:")
        _table(["POS", "TASK", "TASK ID", "WORKER", "AGE", "RESERVED"], [
            [str(w.position), w.task or "-", w.task_id or "-", w.worker or "-",
             f"{w.age(now):.1f}s", "yes" if w.reserved_until_ms is not None else "no"]
            for w in state.waiters
        ])


def _echo_holders(holders: Sequence[Holder], now: int) -> None:
    """``inspect``'s table of holders, with the slots each takes when one takes several."""
    weighted = any(h.cost > 1 for h in holders)
    _table(["HOLDER", "TASK ID", "TASK", "WORKER", "PID", "AGE", "LEASE LEFT", "FENCE"]
           + (["SLOTS"] if weighted else []), [
        [h.token, h.task_id or "-", h.task or "-", h.worker or "-",
         "-" if h.pid is None else str(h.pid), f"{h.age(now):.1f}s",
         f"{h.lease_left(now):.1f}s" if h.lease_end_ms > now else "expired",
         str(h.fence)] + ([str(h.cost)] if weighted else [])
        for h in holders
    ])


def _limit_words(state: LimitState) -> List[str]:
    """The configured slots, an override and a pause, in words."""
    words = [f"configured {_or(state.configured_slots, '?')}"]
    if state.slots_override is not None:
        words.append(f"override {state.slots_override}")
    if state.paused:
        words.append("paused until resumed" if state.paused_until_ms is None else
                     f"paused until {_iso(state.paused_until_ms)} "
                     f"(in {span(state.pause_left or 0)})")
    return words


def inspect_json(state: LimitState) -> Dict[str, Any]:
    """What ``inspect --json`` prints for one key."""
    now = state.server_time_ms
    row = status_row(state)
    return {
        **{field: row[field] for field in ("key", "name", "used", "limit",
                                           "configured_limit", "slots_override", "paused",
                                           "paused_until", "pause_left_seconds")},
        "holders": [_holder_json(holder, now) for holder in state.holders],
        "reservations": [{"ticket": r.ticket, "left_seconds": round((r.until_ms - now) / 1000, 3),
                          "cost": r.cost} for r in state.reservations],
        "waiting": state.waiting,
        "waiters": [_waiter_json(waiter, now) for waiter in state.waiters],
    }


@redislock.command()
@click.argument("name")
@click.argument("holder")
@click.pass_context
@_cli_errors
def release(ctx: click.Context, name: str, holder: str) -> None:
    """Free one holder of semaphore NAME: HOLDER is its token or a unique start of it.

    The entry is removed at once and the slot handed to the oldest waiter; the run that
    held it is not stopped, so only free a holder you know is dead.
    """
    store = _store(ctx)
    key = store.key_of(name)
    found = control.release_holder(store.app, key, holder,
                                   prefix=store.prefix)
    what = ", ".join(f"{label} {value}" for label, value in (
        ("task", found.task), ("task id", found.task_id), ("worker", found.worker),
        ("pid", found.pid)) if value is not None)
    click.echo(f"freed holder {found.token} of {semaphore_name(key, store.prefix)}"
               + (f" ({what})" if what else ""))


@redislock.command()
@click.pass_context
@_cli_errors
def reap(ctx: click.Context) -> None:
    """Remove holder entries whose lease has run out, from every semaphore.

    Live holders, live reservations for waiters and the statistics entries are never
    touched (reservations whose time ran out go too). Prints how many entries were
    removed.
    """
    store = _store(ctx)
    now = store.now_ms()
    removed = 0
    keys = limit_semaphore_keys(store.client, store.prefix, marks=("s",))
    for batch in batches(keys, 200):
        pipe = store.client.pipeline(transaction=False)
        for key in batch:
            pipe.zremrangebyscore(key, "(0", now)
        removed += sum(int(count) for count in pipe.execute())
    click.echo(f"reaped {removed} expired holder entr{'y' if removed == 1 else 'ies'}")


@redislock.command(name="set-slots", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("slots", metavar="N")
@click.option("--force", is_flag=True,
              help="Also for a name no run has used yet and no registered task uses.")
@click.pass_context
@_cli_errors
def set_slots(ctx: click.Context, name: str, slots: str, force: bool) -> None:
    """Override the number of slots of semaphore NAME with N (>= 1), until clear-slots.

    A higher N hands the new slots to waiting runs at once; a lower N never evicts
    running holders: they finish, and runs are admitted again once fewer than N hold a
    slot.
    """
    count = control.check_slots_value(_whole(slots), name)
    store = _store(ctx)
    key = store.key_of(name, force=force)
    singletons = singleton_tasks(store.app, semaphore_name(key, store.prefix))
    if singletons and count != 1:
        raise click.ClickException(
            f"{name!r} is the key of SingletonTask {', '.join(singletons)}, which runs one at "
            f"a time by definition: refusing to set {count} slots (make the task a "
            "LimitedTask with lock_slots to allow more)")
    woken = control.set_slots(store.app, key, count)
    state = store.states([key], store.now_ms())[0]
    click.echo(f"{state.name}: slots set to {count} (configured "
               f"{_or(state.configured_slots, '?')}), {state.used} in use"
               + (f", {woken} waiting run(s) woken" if woken else ""))


@redislock.command(name="clear-slots")
@click.argument("name")
@click.pass_context
@_cli_errors
def clear_slots(ctx: click.Context, name: str) -> None:
    """Drop the slot override of semaphore NAME: the configured count applies again."""
    store = _store(ctx)
    key = store.key_of(name)
    removed = control.clear_slots(store.app, key)
    name = semaphore_name(key, store.prefix)
    click.echo(f"{name}: slot override cleared" if removed else f"{name}: had no slot override")


def _rate_text(row: Dict[str, Any]) -> str:
    """The RATE column: the rate set at run time (``set-rate``), else the configured one."""
    if row.get("rate_override"):
        return f"{row['rate_override']} (set-rate)"
    return row["rate"] or ("yes" if row["rate_limiter"] else "-")


@redislock.command(name="set-rate")
@click.argument("name")
@click.argument("rate", metavar="RATE")
@click.option("--force", is_flag=True,
              help="Also for a name no run has used yet and no registered task uses.")
@click.pass_context
@_cli_errors
def set_rate(ctx: click.Context, name: str, rate: str, force: bool) -> None:
    """Override the rate of limit NAME with RATE (100/m, 10/s, 5/10s) on every
    worker, until clear-rate; the next admission anywhere uses it."""
    control.check_rate_value(rate, name)
    store = _store(ctx)
    key = store.key_of(name, force=force)
    control.set_rate(store.app, key, rate)
    click.echo(f"{semaphore_name(key, store.prefix)}: rate set to {rate}")


@redislock.command(name="clear-rate")
@click.argument("name")
@click.pass_context
@_cli_errors
def clear_rate(ctx: click.Context, name: str) -> None:
    """Drop the rate override of limit NAME: the configured rate applies again."""
    store = _store(ctx)
    key = store.key_of(name)
    removed = control.clear_rate(store.app, key)
    name = semaphore_name(key, store.prefix)
    click.echo(f"{name}: rate override cleared" if removed else f"{name}: had no rate override")


@redislock.command()
@click.argument("name")
@click.option("--until", "until", metavar="T",
              help="End of the pause: ISO-8601 (2030-01-31T12:00:00Z; without an offset, "
                   "local time) or Unix seconds.")
@click.option("--for", "for_", metavar="S",
              help="Length of the pause, with its unit: 90s, 5m, 2h, 1d.")
@click.option("--keep-longer", is_flag=True,
              help="Leave a pause in force that ends later (or never) as it is.")
@click.option("--force", is_flag=True,
              help="Also for a name no run has used yet and no registered task uses.")
@click.pass_context
@_cli_errors
def pause(ctx: click.Context, name: str, until: Optional[str], for_: Optional[str],
          keep_longer: bool, force: bool) -> None:
    """Refuse every run of limit NAME (its semaphore and rate limiter) until resume,
    until T, or for S.

    Refused runs go back to the queue and come back when the pause ends; runs that hold
    a slot are not touched. Times are on the Redis server's clock.
    """
    if until is not None and for_ is not None:
        raise click.ClickException("give --until or --for, not both")
    when = None if until is None else parse_time(until)
    seconds = None if for_ is None else parse_duration(for_, unit_required=True)
    store = _store(ctx)
    key = store.key_of(name, force=force)
    end = control.pause(store.app, key, until=when, seconds=seconds, keep_longer=keep_longer)
    label = semaphore_name(key, store.prefix)
    if end is None:
        click.echo(f"{label}: paused until resumed")
    else:
        left = end - store.now_ms() / 1000
        click.echo(f"{label}: paused until {_iso(round(end * 1000))} (in {span(left)})")


@redislock.command()
@click.argument("name")
@click.pass_context
@_cli_errors
def resume(ctx: click.Context, name: str) -> None:
    """End the pause of limit NAME now, and hand its free slots to waiting runs."""
    store = _store(ctx)
    key = store.key_of(name)
    was_paused = control.resume(store.app, key)
    label = semaphore_name(key, store.prefix)
    click.echo(f"{label}: resumed" if was_paused else f"{label}: was not paused")


@redislock.command()
@click.option("--interval", default="1", metavar="S", show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one view and exit.")
@click.option("--rows", default="5", metavar="N", show_default=True,
              help="Holders and waiters shown per key.")
@click.pass_context
@_cli_errors
def watch(ctx: click.Context, interval: str, once: bool, rows: str) -> None:
    """A live view of every key: slots used/limit, waiting, pause, holders, waiters.

    On a terminal the view is redrawn in place; otherwise (a pipe, a file) each refresh
    is printed after the last. Ctrl-C ends it.
    """
    every = parse_duration(interval, what="--interval")
    shown = _whole(rows)
    if shown < 0:
        raise click.ClickException(f"--rows must be a whole number >= 0, not {rows!r}")
    store = _store(ctx)
    limits = known_limits(store.app, store.prefix)

    def snapshot() -> List[LimitState]:
        now = store.now_ms()
        return [s for s in store.states(store.limit_keys(), now, waiters=shown or 0,
                                        limits=limits)
                if s.exists or s.active or s.rate_limiter]

    run_watch(snapshot, interval=every, once=once, rows=shown)


_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*\Z")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str, what: str = "--for", *, unit_required: bool = False) -> float:
    """Seconds from ``"30"``, ``"1.5"``, ``"90s"``, ``"5m"``, ``"2h"``; > 0. With
    ``unit_required`` a bare number is refused (is ``5`` seconds or minutes?).

        >>> parse_duration("5m"), parse_duration("2.5")
        (300.0, 2.5)
    """
    found = _DURATION.match(value)
    if found and unit_required and found.group(2) is None:
        raise click.ClickException(
            f"{what} needs a unit: {value}s, {value}m, {value}h or {value}d, not {value!r}")
    seconds = float(found.group(1)) * _UNITS[found.group(2)] if found else 0.0
    if not seconds > 0:
        kind = ("a length of time > 0 (90s, 5m, 2h)" if unit_required
                else "a number of seconds > 0 (or 90s, 5m, 2h)")
        raise click.ClickException(f"{what} must be {kind}, not {value!r}")
    return seconds


def parse_time(value: str) -> float:
    """Unix seconds from Unix seconds or ISO-8601 text (no offset: local time).

        >>> parse_time("1700000000"), parse_time("2023-11-14T22:13:20Z")
        (1700000000.0, 1700000000.0)
    """
    try:
        return float(value)
    except ValueError:
        pass
    text_value = value.strip()
    if text_value.endswith(("Z", "z")):
        text_value = text_value[:-1] + "+00:00"
    try:
        return datetime.datetime.fromisoformat(text_value).timestamp()
    except ValueError:
        raise click.ClickException(
            f"--until must be ISO-8601 (2030-01-31T12:00:00Z) or Unix seconds, "
            f"not {value!r}") from None


def _whole(value: str) -> int:
    """An int from CLI text; a :class:`click.ClickException` naming it otherwise."""
    try:
        return int(value)
    except ValueError:
        raise click.ClickException(f"expected a whole number, not {value!r}") from None


def _iso(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _or(value: Any, missing: str) -> str:
    return missing if value is None else str(value)


def _holder_json(holder: Holder, now: int) -> Dict[str, Any]:
    data = asdict(holder)
    for field in ("member", "acquired_ms", "lease_end_ms"):
        del data[field]
    data["age_seconds"] = round(holder.age(now), 3)
    data["lease_left_seconds"] = round(holder.lease_left(now), 3)
    data["expired"] = holder.lease_end_ms <= now
    return data


def _waiter_json(waiter: Waiter, now: int) -> Dict[str, Any]:
    return {"position": waiter.position, "ticket": waiter.ticket, "task": waiter.task,
            "task_id": waiter.task_id, "worker": waiter.worker,
            "age_seconds": round(waiter.age(now), 3),
            "reserved": waiter.reserved_until_ms is not None}


def _table(header: List[str], rows: Iterable[List[str]]) -> None:
    lines: List[Tuple[str, ...]] = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
