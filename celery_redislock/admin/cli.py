"""``celery redislock``: look at, repair and steer an app's limits from the shell.

Registered as a Celery subcommand (entry point group ``celery.commands``), so it runs
against the app given with ``-A`` and the lock store its ``redislock_*`` settings name::

    celery -A proj redislock status            # every key: used/limit, waiting, paused
    celery -A proj redislock status --json     # the same, machine-readable
    celery -A proj redislock inspect crawler   # holders and parked line of "crawler"
    celery -A proj redislock release crawler w1@host|task-1|  # free one holder
    celery -A proj redislock reap              # drop holder entries whose lease ran out
    celery -A proj redislock set-slots crawler 5   # override the slot count
    celery -A proj redislock clear-slots crawler   # back to the configured count
    celery -A proj redislock set-rate partner:acme 100/m   # override the rate
    celery -A proj redislock clear-rate partner:acme       # back to the configured rate
    celery -A proj redislock pause api:t1 --for 30s  # refuse every run for 30 s
    celery -A proj redislock resume api:t1
    celery -A proj redislock watch             # live view
    celery -A proj redislock set-weight proj.work tenant:acme 3  # a fair share's weight
    celery -A proj redislock fair proj.work    # a fair limit's sub-lines waiting

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
from dataclasses import asdict, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import click
from redis.exceptions import RedisError

from ..config.settings import read_settings, redis_client
from ..engine.fair import fair_view
from ..engine.holder import Holder
from ..engine.keys import (
    RATE,
    RATE_CONTROL,
    SEMAPHORE,
    SEMAPHORE_CONTROL,
    companion_key,
    semaphore_key,
)
from ..engine.parked_view import COUNTS as PARKED_COUNTS
from ..engine.refusal import eviction_warning
from ..engine.scan import batches, limit_semaphore_keys, split_key
from ..errors import RedisLockError
from ..integration.task import SingletonTask
from ..parking import ParkingQueues, parking_queue
from . import control
from .parked_text import parked_cell, parked_lines, reservation_for
from .rules import (
    Rules,
    configured_rate,
    override_text,
    rate_column,
    task_rules,
    used_text,
)
from .state import LimitState, pause_short, pause_text, read_states, span
from .table import terminal_width, text_table
from .watch import run_watch

STATUS_SCHEMA = """\
JSON schema of `status --json`: a list with one object per key:
{"key": str, "name": str, "holders": int, "reserved": int, "used": int,
 "limit": int or null, "configured_limit": int or null,
 "slots_override": int or null, "waiting": int, "paused": bool,
 "paused_until": float or null, "pause_left_seconds": float or null,
 "contended": bool, "oldest_age_seconds": float or null,
 "rate_limiter": bool, "rate": str or null, "rate_override": str or null,
 "parked": PARKED (only for a key with a parked line)}
PARKED = {"waiting": int, "references": int, "anonymous": int, "reserved": int,
 "claimed": int, "served": int, "last_parked_age_seconds": float or null,
 "oldest_age_seconds": null, "queue": str, "queue_length": int or null,
 "fair_sub_lines": int}.
"used" = the slots of live "holders" + "reserved" (slots kept for runs moved out of
parking); "waiting" is the parked line's "waiting" (its "references" waiting +
"anonymous" entries, counted from the broker after the lock store lost its data);
"claimed": moved runs admitted, not yet started; "served": references kept so that a
copy given back ends unrun; the parked
line's oldest waiter's age is not kept (null); "queue_length" is the parking
queue's length in the broker, null when the broker could not be asked;
"fair_sub_lines": sub-lines of a fair limit (fair_by) with runs waiting, 0 if none
(the column SUB-LINES; `fair NAME` lists the first by turn);
"holders" counts runs, a weighted run (lock_cost) using several slots; "limit" is the
count admission applies now: "slots_override" if set, else "configured_limit"
(null when unknown); "paused_until" is Unix seconds on the Redis server's clock,
null when not paused or paused until resumed; "rate_limiter" is true when the
name has a rate limiter's state in Redis; "rate" is the rate that limits it
("10/s", "5/10s (burst 0)"): the one its state was counted in, else its tasks'
("?" when two tasks' templates disagree), null without one."""


def semaphore_name(key: str, prefix: str) -> str:
    """The readable name in a semaphore's key (cut names end with ``~``).

        >>> semaphore_name("redislock:{85280b862f4ca735}:s:customer:42", "redislock:")
        'customer:42'
    """
    split = split_key(key, prefix)
    return split[1] if split else key


def _constant_rules(app: Any) -> Iterable[Tuple[str, Any]]:
    """(name, rule) of every limit rule of the app's tasks whose key does not depend on
    the task's arguments."""
    for _, rule in task_rules(app):
        if rule.key.is_constant:
            yield rule.key.render((), {}), rule


def singleton_tasks(app: Any, name: str) -> List[str]:
    """The ``SingletonTask`` tasks of ``app`` whose limit name may be ``name``."""
    found = []
    for task, rule in task_rules(app):
        if isinstance(task, SingletonTask) and rule.key.could_render(name):
            found.append(task.name)
    return sorted(set(found))


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

    def __init__(self, app: Any, *, broker: bool = True) -> None:
        self.app = app
        self.settings = read_settings(app)
        self.prefix = self.settings.prefix
        self.client = redis_client(app, self.settings)
        #: Asks the broker the parking queues' lengths; None: never (``broker=False``).
        self.queues: Optional[ParkingQueues] = ParkingQueues(app) if broker else None

    def now_ms(self) -> int:
        """The Redis server's time, in ms."""
        seconds, microseconds = self.client.time()
        return int(seconds) * 1000 + int(microseconds) // 1000

    def limit_keys(self) -> List[str]:
        """The semaphore key of every name with a semaphore, a parked line, a rate
        limiter or a control hash under the app's prefix, sorted."""
        return limit_semaphore_keys(self.client, self.prefix,
                                    marks=(SEMAPHORE, SEMAPHORE_CONTROL, RATE, RATE_CONTROL,
                                           PARKED_COUNTS))

    @functools.cached_property
    def rules(self) -> Rules:
        """The slots and rates the app's tasks give limit names."""
        return Rules(self.app)

    def states(self, keys: List[str], now: int) -> List[LimitState]:
        """The state of each key, in batches; the configured count of a key that no
        admission recorded one for is the one the app's tasks give it, if they agree."""
        found: List[LimitState] = []
        for batch in batches(keys, 200):
            found.extend(read_states(self.client, batch, now, prefix=self.prefix))
        return self.with_parked_messages([self.configured(state) for state in found])

    def with_parked_messages(self, states: List[LimitState]) -> List[LimitState]:
        """``states`` with their parking queues' lengths, for those with a parked line,
        when the broker can be asked (see :attr:`queues`); else as they are."""
        parked = [state.key for state in states if state.parked is not None]
        if not parked or self.queues is None:
            return states
        lengths = self.queues.lengths(parked) or {}
        return [replace(state, parked_messages=lengths[state.key])
                if state.key in lengths else state for state in states]

    @property
    def broker_error(self) -> Optional[str]:
        """Why the last ask of the parking queues' lengths failed, or None."""
        return None if self.queues is None else self.queues.error

    def configured(self, state: LimitState) -> LimitState:
        """``state`` with the configured slot count the app's tasks give it, when Redis
        has none recorded."""
        if state.configured_slots is not None:
            return state
        slots = self.rules.slots_of(state.name, state.tasks)
        return state if slots is None else replace(state, configured_slots=slots)

    def key_of(self, name: str, *, force: bool = False) -> str:
        """The semaphore key of limit ``name`` (a name, or one of its full keys).

        Raises :class:`click.ClickException` when Redis has nothing of that name (no
        semaphore, parked line, rate limiter or control hash) and no registered task's
        key makes it (a template such as ``customer:{customer_id}`` makes
        ``customer:999``), unless ``force``.
        """
        key, _ = control.limit_keys(name, self.prefix)
        if force or key in registered_keys(self.app, self.prefix) \
                or control.tasks_making(self.app, name):
            return key
        pipe = self.client.pipeline(transaction=False)
        for mark in (SEMAPHORE, SEMAPHORE_CONTROL, RATE, RATE_CONTROL, PARKED_COUNTS):
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


def status_entries(store: LockStore) -> List[Tuple[LimitState, Dict[str, Any]]]:
    """(state, ``status --json`` row) of every name the lock store has anything of,
    sorted by name."""
    states = [state for state in store.states(store.limit_keys(), store.now_ms())
              if state.exists or state.active or state.rate_limiter]
    states.sort(key=lambda state: state.name)
    return [(state, status_row(state, store.rules)) for state in states]


def status_row(state: LimitState, rules: Optional[Rules] = None) -> Dict[str, Any]:
    """The ``status --json`` row of one key; ``rules`` give its configured rate."""
    now = state.server_time_ms
    live = state.live_holders
    row = {
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
        "rate": configured_rate(state, rules),
        "rate_override": (None if state.rate_override is None
                          else override_text(state.rate_override)),
    }
    if state.parked is not None:
        row["parked"] = parked_json(state)
    return row


def parked_json(state: LimitState) -> Dict[str, Any]:
    """The ``parked`` object of a key with a parked line (see :data:`STATUS_SCHEMA`)."""
    line = state.parked
    assert line is not None
    age = line.last_parked_age
    return {"waiting": line.waiting, "references": line.references_waiting,
            "anonymous": line.anonymous, "reserved": line.reserved,
            "claimed": line.claimed, "served": line.served,
            "last_parked_age_seconds": None if age is None else round(age, 3),
            "oldest_age_seconds": line.oldest_age, "queue": parking_queue(state.key),
            "queue_length": state.parked_messages, "fair_sub_lines": line.fair_sub_lines}


@redislock.command(help="List every key, sorted by name: slots used/limit, waiting runs, "
                        "pause, slot override, oldest holder age, rate. Long names are cut "
                        "to fit the terminal; --wide prints them whole, with the configured "
                        "count and contention.\n\n\b\n" + STATUS_SCHEMA)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema below).")
@click.option("--wide", is_flag=True, help="Every column, nothing cut.")
@click.pass_context
@_cli_errors
def status(ctx: click.Context, as_json: bool, wide: bool) -> None:
    store = _store(ctx)
    entries = status_entries(store)
    warning = eviction_warning(store.client)
    if warning:
        click.echo(f"WARNING: {warning}", err=True)
    _broker_note(store, [state for state, _ in entries])
    if as_json:
        click.echo(json.dumps([row for _, row in entries], indent=2))
        return
    if not entries:
        click.echo("no limits in the lock store")
        return
    for line in status_lines(entries, store.rules, wide=wide):
        click.echo(line)


def status_lines(entries: Sequence[Tuple[LimitState, Dict[str, Any]]], rules: Rules, *,
                 wide: bool = False) -> List[str]:
    """``status``'s table: the usual columns cut to the terminal, or every column whole."""
    header = (["NAME", "USED", "CONFIGURED", "OVERRIDE", "WAITING", "PAUSED", "CONTENDED",
               "OLDEST", "RATE"] if wide else
              ["NAME", "USED", "WAITING", "PAUSED", "OVERRIDE", "OLDEST", "RATE"])
    if any(state.parked is not None for state, _ in entries):
        header += ["PARKED", "SERVED"] if wide else ["PARKED"]
    if any(state.parked is not None and state.parked.fair_sub_lines for state, _ in entries):
        header += ["SUB-LINES"]
    rows = []
    for state, row in entries:
        oldest = row["oldest_age_seconds"]
        cells = {
            "NAME": row["name"], "USED": used_text(state),
            "CONFIGURED": _or(row["configured_limit"], "?"),
            "OVERRIDE": _or(row["slots_override"], "-"), "WAITING": str(row["waiting"]),
            "PAUSED": pause_text(state) if wide else pause_short(state),
            "CONTENDED": "yes" if row["contended"] else "no",
            "OLDEST": "-" if oldest is None else f"{oldest:.1f}s",
            "RATE": rate_column(state, rules),
            "PARKED": parked_cell(state),
            "SERVED": "-" if state.parked is None else str(state.parked.served),
            "SUB-LINES": sub_lines_cell(state),
        }
        rows.append([cells[column] for column in header])
    return text_table(header, rows, width=None if wide else terminal_width(), shrink=[0])


def sub_lines_cell(state: LimitState) -> str:
    """The SUB-LINES column: how many sub-lines of a fair limit have runs waiting (the
    count only, never the sub-lines: ``fair NAME --top N`` lists them); ``-`` for none.

        >>> sub_lines_cell(LimitState("n", "k", 0))
        '-'
    """
    line = state.parked
    return str(line.fair_sub_lines) if line is not None and line.fair_sub_lines else "-"


def _broker_note(store: LockStore, states: Sequence[LimitState]) -> None:
    """One line on stderr when keys have a parked line and the broker was not asked."""
    if store.broker_error and any(state.parked is not None for state in states):
        click.echo(f"note: parking queues' lengths unknown (broker: {store.broker_error}); "
                   "the lock store's counts are shown", err=True)


@redislock.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--wide", is_flag=True, help="Every column (holder token, pid, fence), "
                                           "nothing cut.")
@click.pass_context
@_cli_errors
def inspect(ctx: click.Context, name: str, as_json: bool, wide: bool) -> None:
    """Show the holders and parked line of limit NAME (its name, or its full key).

    Entries whose lease ran out but are not yet removed are shown as expired. Rows are
    cut to fit the terminal (never the task id, which `release` takes); --wide prints
    them whole.

    \b
    With --json: {"key": str, "name": str, "used": int, "limit": int|null,
    "configured_limit": int|null, "slots_override": int|null, "paused": bool,
    "paused_until": float|null, "pause_left_seconds": float|null,
    "rate": str|null, "rate_override": str|null,
    "holders": [{"token": str, "task_id": str|null, "task": str|null,
      "worker": str|null, "pid": int|null, "args": str|null, "age_seconds": float,
      "lease_left_seconds": float, "fence": int, "expired": bool, "cost": int}],
    "reservations": [{"ticket": str, "left_seconds": float, "cost": int}],
    "waiting": int,
    "parked": {...} (as in `status --json`, for a key with a parked line),
    "fair": {...} (as in `fair --json`, for a fair limit with sub-lines waiting)}.
    "waiting" counts the parked line's runs (it keeps counts, not a list: its runs
    wait in the broker's parking queue).
    """
    store = _store(ctx)
    key = store.key_of(name)
    now = store.now_ms()
    state = store.states([key], now)[0]
    _broker_note(store, [state])
    fair_line = fair_view(store.client, key, top=10,  # a fair limit's sub-lines (fair_by)
                          aging=fair_cli.aging_of(store, state.name))
    if as_json:
        shown_json = inspect_json(state, store.rules)
        if fair_line.waiting:
            shown_json["fair"] = fair_cli.fair_json(fair_line)
        click.echo(json.dumps(shown_json, indent=2))
        return
    for line in inspect_lines(state, store.rules, wide=wide):
        click.echo(line)
    if fair_line.waiting:
        for line in fair_cli.fair_lines(fair_line):
            click.echo(line)


def inspect_lines(state: LimitState, rules: Optional[Rules] = None, *,
                  wide: bool = False) -> List[str]:
    """``inspect``'s text: the limit, its holders, reservations and parked line."""
    now = state.server_time_ms
    width = None if wide else terminal_width()
    lines = [f"{state.name}: {len(state.live_holders)} live holder(s), "
             f"{used_text(state)} slots used, {state.waiting} waiting",
             f"key: {state.key}",
             "slots: " + ", ".join(_limit_words(state)),
             f"rate: {rate_column(state, rules)}"]
    if state.holders:
        lines.extend(_holder_lines(state.holders, now, width))
    for reservation in state.reservations:
        slots = f"{reservation.cost} slots" if reservation.cost > 1 else "a slot"
        lines.append(f"{slots} reserved for {reservation_for(reservation.ticket)}: "
                     f"{(reservation.until_ms - now) / 1000:.1f}s left")
    lines.extend(parked_lines(state))
    return lines


def _holder_lines(holders: Sequence[Holder], now: int, width: Optional[int]) -> List[str]:
    """``inspect``'s table of holders, with the slots each takes when one takes several;
    without ``width`` (``--wide``) every column, else those that tell who holds it."""
    weighted = any(h.cost > 1 for h in holders)
    wide = width is None
    header = (["HOLDER", "TASK ID", "TASK", "WORKER", "PID", "AGE", "LEASE LEFT", "FENCE"]
              if wide else ["TASK ID", "TASK", "WORKER", "AGE", "LEASE"])
    rows = []
    for h in holders:
        cells = {"HOLDER": h.token, "TASK ID": h.task_id or ("-" if wide else h.token),
                 "TASK": h.task or "-", "WORKER": h.worker or "-",
                 "PID": "-" if h.pid is None else str(h.pid), "AGE": f"{h.age(now):.1f}s",
                 "FENCE": str(h.fence)}
        cells["LEASE"] = cells["LEASE LEFT"] = (f"{h.lease_left(now):.1f}s"
                                                if h.lease_end_ms > now else "expired")
        rows.append([cells[column] for column in header] + [h.args or "-"]
                    + ([str(h.cost)] if weighted else []))
    header = header + ["ARGS"] + (["SLOTS"] if weighted else [])
    args = header.index("ARGS")
    return text_table(header, rows, width=width,
                      shrink=[args, header.index("WORKER"), header.index("TASK")])


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


def inspect_json(state: LimitState, rules: Optional[Rules] = None) -> Dict[str, Any]:
    """What ``inspect --json`` prints for one key."""
    now = state.server_time_ms
    row = status_row(state, rules)
    return {
        **{field: row[field] for field in ("key", "name", "used", "limit",
                                           "configured_limit", "slots_override", "paused",
                                           "paused_until", "pause_left_seconds", "rate",
                                           "rate_override")},
        "holders": [_holder_json(holder, now) for holder in state.holders],
        "reservations": [{"ticket": r.ticket, "left_seconds": round((r.until_ms - now) / 1000, 3),
                          "cost": r.cost} for r in state.reservations],
        "waiting": state.waiting,
        **({} if state.parked is None else {"parked": parked_json(state)}),
    }


@redislock.command()
@click.argument("name")
@click.argument("holder")
@click.pass_context
@_cli_errors
def release(ctx: click.Context, name: str, holder: str) -> None:
    """Free one holder of semaphore NAME: HOLDER is its task id (as `inspect` shows),
    its token, or a unique start of the token.

    The entry is removed at once and the slot handed to the parked line; the run that
    held it is not stopped, so only free a holder you know is dead.
    """
    store = _store(ctx)
    key = store.key_of(name)
    found = control.release_holder(store.app, key, _holder_token(store, key, holder),
                                   prefix=store.prefix)
    what = ", ".join(f"{label} {value}" for label, value in (
        ("task", found.task), ("task id", found.task_id), ("worker", found.worker),
        ("pid", found.pid)) if value is not None)
    click.echo(f"freed holder {found.token} of {semaphore_name(key, store.prefix)}"
               + (f" ({what})" if what else ""))


def _holder_token(store: LockStore, key: str, holder: str) -> str:
    """The token of the one holder whose task id is ``holder`` (what ``inspect``
    shows), when no token starts with it; else ``holder`` as it is."""
    holders = store.holders(key)
    if any(h.token.startswith(holder) for h in holders):
        return holder
    runs = [h.token for h in holders if h.task_id == holder]
    return runs[0] if len(runs) == 1 else holder


@redislock.command()
@click.pass_context
@_cli_errors
def reap(ctx: click.Context) -> None:
    """Remove holder entries whose lease has run out, from every semaphore.

    Live holders, live reservations and the statistics entries are never
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
              help="Holders shown per key.")
@click.option("--wide", is_flag=True, help="Lines as long as they are, not cut to the "
                                           "terminal.")
@click.pass_context
@_cli_errors
def watch(ctx: click.Context, interval: str, once: bool, rows: str, wide: bool) -> None:
    """A live view of every key: slots used/limit, waiting, pause, holders.

    On a terminal the view is redrawn in place; otherwise (a pipe, a file) each refresh
    is printed after the last. Ctrl-C ends it.
    """
    every = parse_duration(interval, what="--interval")
    shown = _whole(rows)
    if shown < 0:
        raise click.ClickException(f"--rows must be a whole number >= 0, not {rows!r}")
    store = _store(ctx)

    def snapshot() -> List[LimitState]:
        now = store.now_ms()
        return sorted((s for s in store.states(store.limit_keys(), now)
                       if s.exists or s.active or s.rate_limiter), key=lambda s: s.name)

    run_watch(snapshot, interval=every, once=once, rows=shown, rules=store.rules,
              wide=wide)


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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


from . import fair_cli  # noqa: E402  (set-weight, clear-weight, fair: on this group)
