"""The ``web`` subcommand of ``celery redislock``: serve the dashboard.

    celery -A proj redislock web --host 127.0.0.1 --port 8000

:data:`redislock` is the ``celery redislock`` group of the admin layer with ``web``
added: the ``celery.commands`` entry point names it, so the admin layer's CLI needs no
import of this higher layer.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional, Tuple

import click

from ..admin.cli import LockStore
from ..admin.cli import redislock as admin_group
from .security import MIN_TOKEN_LENGTH, TOKEN_ENV
from .state import Dashboard

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def add_web_command(group: click.Group) -> None:
    """Add the ``web`` command to the ``celery redislock`` click group.

        >>> import click
        >>> group = click.Group("redislock")
        >>> add_web_command(group)
        >>> "web" in group.commands
        True
    """
    group.add_command(web)


def _group() -> click.Group:
    """The admin layer's ``celery redislock`` group, with :func:`web` added."""
    add_web_command(admin_group)
    return admin_group


def _server() -> Tuple[Any, Any]:
    """(uvicorn, the app module): imported when the command runs, since they need the
    ``web`` extra, which ``celery redislock``'s other commands do without."""
    try:
        return (importlib.import_module("uvicorn"),
                importlib.import_module(f"{__package__}.app"))
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the web extra ({exc.name} is missing): "
            "pip install 'celery-redislock[web]'") from None


def _celery_app(ctx: click.Context) -> Any:
    from celery.bin.base import CLIContext

    obj = ctx.find_object(CLIContext)
    if obj is None or obj.app is None:
        raise click.ClickException("no Celery app: run as `celery -A proj redislock web`")
    return obj.app


def _token(allow_actions: bool, token: Optional[str]) -> Optional[str]:
    """The token actions need, checked; None when actions are off."""
    if not allow_actions:
        return None
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None:
        raise click.ClickException(
            f"--allow-actions needs a token: set {TOKEN_ENV} (or give --token)")
    if len(token) < MIN_TOKEN_LENGTH:
        raise click.ClickException(
            f"the token must be at least {MIN_TOKEN_LENGTH} characters long")
    return token


@click.command(name="web")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.2),
              help="Seconds between the page's refreshes (and history samples).")
@click.option("--rows", default=20, show_default=True, type=click.IntRange(min=1),
              help="Holders listed per key.")
@click.option("--history", default=120, show_default=True, type=click.IntRange(min=2),
              help="Samples of each key kept for its history chart.")
@click.option("--allow-actions", is_flag=True,
              help="Offer release, pause/resume and set-slots on the page (POST, with the "
                   f"token in a header). Needs a token: {TOKEN_ENV} or --token.")
@click.option("--token", default=None, metavar="TEXT",
              help=f"The actions' token (>= {MIN_TOKEN_LENGTH} characters); prefer the "
                   f"{TOKEN_ENV} environment variable, which other users cannot see.")
@click.option("--allowed-origin", "allowed_origins", multiple=True, metavar="URL",
              help="Another origin (https://ops.example.com) whose pages may send actions; "
                   "the dashboard's own origin always may.")
@click.pass_context
def web(ctx: click.Context, host: str, port: int, interval: float, rows: int,
        history: int, allow_actions: bool, token: Optional[str],
        allowed_origins: Tuple[str, ...]) -> None:
    """Serve a live dashboard of every key: used/limit, waiting, rate, history,
    holders and parked line; JSON of the same at /api/state.

    Read-only unless --allow-actions is given with a token. Needs the `web` extra:
    pip install 'celery-redislock[web]'.
    """
    secret = _token(allow_actions, token)
    uvicorn, server = _server()
    celery_app = _celery_app(ctx)
    dashboard = Dashboard(LockStore(celery_app), rows=rows, history=history,
                          min_interval=interval / 2, refresh=interval)
    app = server.create_app(dashboard, token=secret, control_app=celery_app,
                     allowed_origins=allowed_origins)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"celery-redislock dashboard on http://{shown}:{port}/ "
               f"({'actions allowed' if secret else 'read-only'}); Ctrl-C stops it")
    if host not in _LOOPBACK:
        click.echo(f"note: listening on {host}: anyone who can reach it sees task ids and "
                   "worker names; put it behind an authenticating proxy (docs/web.md)",
                   err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False,
                proxy_headers=False)


#: ``celery redislock``: every admin command and ``web`` (the entry point's target).
redislock = _group()
