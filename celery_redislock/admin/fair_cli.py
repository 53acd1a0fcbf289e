"""``celery redislock set-weight / clear-weight / fair``: the sub-lines of a fair limit
(``fair_by``) from the shell (see :mod:`.fair_control`)::

    celery -A proj redislock set-weight proj.work tenant:acme 3   # 3 turns for 1
    celery -A proj redislock clear-weight proj.work tenant:acme   # back to 1
    celery -A proj redislock fair proj.work --top 5               # sub-lines waiting
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import click

from ..engine.fair import DEFAULT_AGING, FairLine
from . import fair_control
from .cli import _cli_errors, _store, redislock
from .table import text_table


def fair_lines(line: FairLine) -> List[str]:
    """The text of a fair line: how many sub-lines wait, and the first by turn.

        >>> from celery_redislock.engine.fair import SubLine
        >>> print("\\n".join(fair_lines(FairLine(2, 4.0, (
        ...     SubLine("tenant:a", 4.0, 7, 1.0, 12.34), SubLine("tenant:b", 4.5, 1, 2.0))))))
        fair: 2 sub-line(s) waiting, virtual time 4; first by turn:
          SUB-LINE  TURN  WAITING  WEIGHT  OLDEST
          tenant:a  4     7        1       12.3s
          tenant:b  4.5   1        2       -

    OLDEST is the sub-line's oldest waiter's age where the lock store keeps it (runs
    that wait in priority bands: :func:`~..engine.fair.oldest_waiters`), else ``-``.
    """
    head = (f"fair: {line.waiting} sub-line(s) waiting, virtual time "
            f"{line.virtual_time:g}" + ("; first by turn:" if line.first else ""))
    if not line.first:
        return [head]
    rows = [[sub.sub, f"{sub.turn:g}", str(sub.waiting), f"{sub.weight:g}",
             "-" if sub.oldest_age is None else f"{sub.oldest_age:.1f}s"]
            for sub in line.first]
    table = text_table(["SUB-LINE", "TURN", "WAITING", "WEIGHT", "OLDEST"], rows)
    return [head, *("  " + row.rstrip() for row in table)]


def fair_json(line: FairLine) -> Dict[str, Any]:
    """A fair line as JSON: ``{"sub_lines_waiting": int, "virtual_time": float,
    "first": [{"sub": str, "turn": float, "waiting": int, "weight": float,
    "oldest_age_seconds": float or null}]}`` (null: not kept, runs without a band)."""
    return {"sub_lines_waiting": line.waiting, "virtual_time": line.virtual_time,
            "first": [{"sub": sub.sub, "turn": sub.turn, "waiting": sub.waiting,
                       "weight": sub.weight,
                       "oldest_age_seconds": None if sub.oldest_age is None
                       else round(sub.oldest_age, 3)} for sub in line.first]}


def aging_of(store: Any, name: str) -> float:
    """The ``lock_priority_aging`` of the fair limit ``name`` by the app's tasks (the
    default, 10 s, when none or several disagree): what one band is worth, to read a
    sub-line's oldest waiter."""
    rules = getattr(store, "rules", None)
    found = rules.aging_of(name) if rules is not None else None
    return DEFAULT_AGING if found is None else found


@redislock.command(name="set-weight")
@click.argument("name")
@click.argument("sub", metavar="SUB_LINE")
@click.argument("weight", metavar="WEIGHT")
@click.pass_context
@_cli_errors
def set_weight(ctx: click.Context, name: str, sub: str, weight: str) -> None:
    """Give SUB_LINE (a key the limit's fair_by renders, e.g. tenant:acme) of the fair
    limit NAME the WEIGHT (a number above 0; default 1): WEIGHT turns for another's one
    while both wait, from the sub-line's next turn, on every worker."""
    value = fair_control.check_weight_value(weight, name, sub)
    store = _store(ctx)
    key = store.key_of(name, force=True)
    fair_control.set_weight(store.client, key, sub, value, prefix=store.prefix)
    click.echo(f"{name}: weight of {sub} set to {value:g}")


@redislock.command(name="clear-weight")
@click.argument("name")
@click.argument("sub", metavar="SUB_LINE")
@click.pass_context
@_cli_errors
def clear_weight(ctx: click.Context, name: str, sub: str) -> None:
    """Give SUB_LINE of the fair limit NAME the default weight (1) again."""
    store = _store(ctx)
    key = store.key_of(name, force=True)
    cleared = fair_control.clear_weight(store.client, key, sub, prefix=store.prefix)
    click.echo(f"{name}: weight of {sub} " + ("cleared" if cleared else "was the default"))


@redislock.command(name="fair")
@click.argument("name")
@click.option("--top", default=10, show_default=True, help="How many sub-lines to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (as fair_json).")
@click.pass_context
@_cli_errors
def fair(ctx: click.Context, name: str, top: int, as_json: bool) -> None:
    """Show the sub-lines of the fair limit NAME waiting: how many, and the first TOP by
    turn (the next slot goes to the first), with their waiting runs, weights and oldest
    waiter's age (known for runs waiting in priority bands; '-' otherwise)."""
    store = _store(ctx)
    key = store.key_of(name, force=True)
    line = fair_control.fair_state(store.client, key, top=max(0, top), prefix=store.prefix,
                                   aging=aging_of(store, name))
    if as_json:
        click.echo(json.dumps(fair_json(line), indent=2))
        return
    for text in fair_lines(line):
        click.echo(text)
