"""``celery redislock``: look at and repair an app's semaphores from the shell.

Registered as a Celery subcommand (entry point group ``celery.commands``), so it runs
against the app given with ``-A`` and the lock store its ``redislock_*`` settings name::

    celery -A proj redislock status            # every semaphore: used/limit, contention
    celery -A proj redislock status --json     # the same, machine-readable
    celery -A proj redislock inspect crawler   # who holds semaphore "crawler"
    celery -A proj redislock release crawler w1@host|task-1|  # free one holder
    celery -A proj redislock reap              # drop holder entries whose lease ran out

Every age and lease is measured on the Redis server's clock (``TIME``), the clock the
leases themselves are written in. The number of slots of a semaphore is not stored in
Redis: ``status`` shows it only for keys of registered tasks (``LimitedTask`` options or
``redislock_limits`` entries) whose key does not depend on the task's arguments.

Errors (unknown semaphore, unknown or ambiguous holder, Redis unreachable, broken
settings) print one line on stderr and exit with status 1.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from typing import Any, Callable, Dict, Iterable, List, Tuple

import click
from redis.exceptions import RedisError

from .config import config_limits, task_function
from .errors import RedisLockError
from .holder import Holder, parse_holder, text
from .keys import semaphore_key
from .recovery import limits_of
from .scan import SEMAPHORE_MARK, batches, semaphore_key_pattern
from .settings import read_settings, redis_client

#: Separates the hash tag from the readable name in a semaphore's key.

STATUS_SCHEMA = """\
JSON schema of `status --json`: a list with one object per semaphore key:
{"key": str, "name": str, "holders": int, "limit": int or null,
 "contended": bool, "oldest_age_seconds": float or null}.
"holders" counts live leases; "limit" is null when the slot count is not known
(it is not stored in Redis); "contended" is true once a run has been refused;
"oldest_age_seconds" is null without live holders."""


def semaphore_name(key: str, prefix: str) -> str:
    """The readable name in a semaphore's key (cut names end with ``~``).

        >>> semaphore_name("redislock:{85280b862f4ca735}:s:customer:42", "redislock:")
        'customer:42'
    """
    rest = key[len(prefix):] if key.startswith(prefix) else key
    return rest.partition(SEMAPHORE_MARK)[2] or rest


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
    for name, task in list(app.tasks.items()):
        try:
            limits = limits_of(task) or config_limits(app, name, task_function(task))
        except Exception:  # a broken limit: `celery check_limits`'s business, not ours
            continue
        if limits is None:
            continue
        for rule in limits.rules:
            if rule.slots is not None and rule.key.is_constant:
                key = semaphore_key(rule.key.render((), {}), prefix)
                found.setdefault(key, set()).add(rule.slots)
    return {key: next(iter(slots)) for key, slots in found.items() if len(slots) == 1}


class LockStore:
    """The lock store of a Celery app: its settings, client and server clock.

        store = LockStore(app)
        for key in store.semaphore_keys():
            print(key, len(store.holders(key, store.now_ms())))
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

    def semaphore_keys(self) -> List[str]:
        """Every semaphore key under the app's prefix, sorted."""
        keys = {text(key) for key in self.client.scan_iter(
            match=semaphore_key_pattern(self.prefix), count=1000, _type="ZSET")}
        return sorted(keys)

    def key_of(self, name: str) -> str:
        """The key of semaphore ``name`` (a full semaphore key is taken as it is); raises
        :class:`click.ClickException` when Redis has no such semaphore."""
        if name.startswith(self.prefix) and SEMAPHORE_MARK in name:
            key = name
        else:
            key = semaphore_key(name, self.prefix)
        if not self.client.exists(key):
            raise click.ClickException(
                f"no semaphore named {name!r} in the lock store (key {key} does not exist)"
            )
        return key

    def holders(self, key: str, minimum_ms: float = 0) -> List[Holder]:
        """Holder entries of ``key`` whose lease ends after ``minimum_ms``, oldest first."""
        entries = self.client.zrangebyscore(key, f"({minimum_ms}", "+inf", withscores=True)
        return sorted((parse_holder(member, score) for member, score in entries),
                      key=lambda holder: (holder.acquired_ms, holder.token))


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
    return LockStore(obj.app)


@click.group(name="redislock")
def redislock() -> None:
    """Look at and repair the celery-redislock semaphores of the app (-A).

    Ages and leases are timed by the Redis server's clock.
    """


@redislock.command(help="List every semaphore: holders, limit if known, contention, "
                        "oldest holder age.\n\n\b\n" + STATUS_SCHEMA)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema below).")
@click.pass_context
@_cli_errors
def status(ctx: click.Context, as_json: bool) -> None:
    store = _store(ctx)
    limits = known_limits(store.app, store.prefix)
    now = store.now_ms()
    rows = []
    for batch in batches(store.semaphore_keys(), 200):
        pipe = store.client.pipeline(transaction=False)
        for key in batch:
            pipe.zrangebyscore(key, f"({now}", "+inf", withscores=True)
            pipe.zscore(key, "#hold")
        replies = pipe.execute()
        for index, key in enumerate(batch):
            live = [parse_holder(m, s) for m, s in replies[2 * index]]
            rows.append({
                "key": key,
                "name": semaphore_name(key, store.prefix),
                "holders": len(live),
                "limit": limits.get(key),
                "contended": replies[2 * index + 1] is not None,
                "oldest_age_seconds": (
                    round(max(h.age(now) for h in live), 3) if live else None
                ),
            })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no semaphores")
        return
    _table(["NAME", "USED", "CONTENDED", "OLDEST"], [
        [row["name"], f"{row['holders']}/{'?' if row['limit'] is None else row['limit']}",
         "yes" if row["contended"] else "no",
         "-" if row["oldest_age_seconds"] is None else f"{row['oldest_age_seconds']:.1f}s"]
        for row in rows
    ])


@redislock.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@_cli_errors
def inspect(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show the holders of semaphore NAME (its name, or its full Redis key).

    Entries whose lease ran out but are not yet removed are shown as expired.

    \b
    With --json: {"key": str, "name": str, "holders": [{"token": str,
    "task_id": str|null, "task": str|null, "worker": str|null, "pid": int|null,
    "age_seconds": float, "lease_left_seconds": float, "fence": int,
    "expired": bool}]}.
    """
    store = _store(ctx)
    key = store.key_of(name)
    now = store.now_ms()
    holders = store.holders(key)
    if as_json:
        click.echo(json.dumps({
            "key": key,
            "name": semaphore_name(key, store.prefix),
            "holders": [_holder_json(holder, now) for holder in holders],
        }, indent=2))
        return
    click.echo(f"{semaphore_name(key, store.prefix)} ({key}): "
               f"{sum(h.lease_end_ms > now for h in holders)} live holder(s)")
    if holders:
        _table(["HOLDER", "TASK ID", "TASK", "WORKER", "PID", "AGE", "LEASE LEFT", "FENCE"], [
            [h.token, h.task_id or "-", h.task or "-", h.worker or "-",
             "-" if h.pid is None else str(h.pid), f"{h.age(now):.1f}s",
             f"{h.lease_left(now):.1f}s" if h.lease_end_ms > now else "expired",
             str(h.fence)]
            for h in holders
        ])


@redislock.command()
@click.argument("name")
@click.argument("holder")
@click.pass_context
@_cli_errors
def release(ctx: click.Context, name: str, holder: str) -> None:
    """Free one holder of semaphore NAME: HOLDER is its token or a unique start of it.

    The entry is removed at once; the run that held it is not stopped, so only free a
    holder you know is dead.
    """
    store = _store(ctx)
    key = store.key_of(name)
    holders = store.holders(key)
    chosen = [h for h in holders if h.token == holder] or [
        h for h in holders if h.token.startswith(holder)
    ]
    if not chosen:
        raise click.ClickException(f"semaphore {name!r} has no holder {holder!r}")
    if len(chosen) > 1:
        tokens = ", ".join(h.token for h in chosen)
        raise click.ClickException(
            f"holder {holder!r} is ambiguous in semaphore {name!r}: it starts {tokens}"
        )
    found = chosen[0]
    if not store.client.zrem(key, found.member):
        raise click.ClickException(f"holder {found.token!r} of {name!r} was already gone")
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

    Live holders and the statistics entries are never touched. Prints how many entries
    were removed.
    """
    store = _store(ctx)
    now = store.now_ms()
    removed = 0
    for batch in batches(store.semaphore_keys(), 200):
        pipe = store.client.pipeline(transaction=False)
        for key in batch:
            pipe.zremrangebyscore(key, "(0", now)
        removed += sum(int(count) for count in pipe.execute())
    click.echo(f"reaped {removed} expired holder entr{'y' if removed == 1 else 'ies'}")


def _holder_json(holder: Holder, now: int) -> Dict[str, Any]:
    data = asdict(holder)
    for field in ("member", "acquired_ms", "lease_end_ms"):
        del data[field]
    data["age_seconds"] = round(holder.age(now), 3)
    data["lease_left_seconds"] = round(holder.lease_left(now), 3)
    data["expired"] = holder.lease_end_ms <= now
    return data


def _table(header: List[str], rows: Iterable[List[str]]) -> None:
    lines: List[Tuple[str, ...]] = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
