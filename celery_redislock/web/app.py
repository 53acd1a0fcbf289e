"""The dashboard's web application (Starlette): the page, its files, ``/api/state`` and,
when allowed, ``/api/action``.

    app = create_app(Dashboard(LockStore(celery_app)))          # read-only
    app = create_app(dashboard, token=secret, control_app=celery_app)   # with actions
    uvicorn.run(app, host="127.0.0.1", port=8000)

Every URL the page uses is relative, so the dashboard works behind a reverse proxy under
any sub-path without being told it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, MutableMapping, Optional, Sequence

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from ..admin import control
from ..errors import RedisLockError
from .security import refusal
from .state import Dashboard

STATIC = Path(__file__).resolve().parent / "static"

#: The files the page is made of, and their media types: nothing else is served.
FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

#: Headers of every response: no framing, no sniffing, no referrer, and a page that
#: may load and fetch from its own origin only.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-resource-policy": "same-origin",
}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]


class SecurityHeaders:
    """ASGI middleware that adds :data:`SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name.encode() not in names:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers={"cache-control": "no-store"})


class Actions:
    """Carries out one action of the page through :mod:`celery_redislock.control`."""

    def __init__(self, dashboard: Dashboard, target: Any) -> None:
        self.dashboard = dashboard
        self.target = target

    def run(self, body: Dict[str, Any]) -> str:
        """Do what ``body`` asks (``{"action": ..., "key": ..., ...}``); return a line
        saying what was done. Raises :class:`control.LimitControlError` on bad input."""
        key = body.get("key")
        known = {row["key"]: row["name"] for row in self.dashboard.state(fresh=True)["keys"]}
        if not isinstance(key, str) or key not in known:
            raise control.LimitControlError(f"no key {key!r} on the dashboard")
        name, action = known[key], body.get("action")
        if action == "release":
            holder = body.get("holder")
            if not isinstance(holder, str) or not holder:
                raise control.LimitControlError("release needs the holder's token")
            freed = control.release_holder(self.target, key, holder)
            return f"{name}: freed holder {freed.token}"
        if action == "pause":
            seconds = body.get("seconds")
            end = control.pause(self.target, key, seconds=seconds)
            return f"{name}: paused" + ("" if end is None else f" for {seconds} s")
        if action == "resume":
            was = control.resume(self.target, key)
            return f"{name}: resumed" if was else f"{name}: was not paused"
        if action == "set-slots":
            slots = control.check_slots_value(body.get("slots"), name)
            woken = control.set_slots(self.target, key, slots)
            return f"{name}: slots set to {slots}, {woken} waiting run(s) woken"
        if action == "clear-slots":
            had = control.clear_slots(self.target, key)
            return f"{name}: slot override cleared" if had else f"{name}: had no override"
        raise control.LimitControlError(f"unknown action {action!r}")


def create_app(dashboard: Dashboard, *, token: Optional[str] = None,
               control_app: Any = None, allowed_origins: Sequence[str] = ()) -> Any:
    """The ASGI app of ``dashboard``. Actions are served only with a ``token`` (and are
    done on ``control_app``, the Celery app, so that freed slots wake waiting runs)."""
    actions = Actions(dashboard, control_app if control_app is not None
                      else dashboard.store.client)

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                            headers={"cache-control": "no-cache"})

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in FILES:
            return Response("not found", status_code=404, media_type="text/plain")
        return FileResponse(STATIC / name, media_type=FILES[name],
                            headers={"cache-control": "no-cache"})

    async def state(request: Request) -> Response:
        try:
            found = await run_in_threadpool(dashboard.state)
            return _json({**found, "actions": token is not None})
        except (RedisError, RedisLockError) as exc:
            return _json({"error": f"lock store: {type(exc).__name__}: {exc}"}, 503)

    async def action(request: Request) -> Response:
        headers = {name.lower(): value for name, value in request.headers.items()}
        why = refusal(request.method, headers, token, allowed_origins)
        if why is not None:
            return _json({"ok": False, "error": why}, 404 if token is None else 403)
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _json({"ok": False, "error": "the body is not JSON"}, 400)
        if not isinstance(body, dict):
            return _json({"ok": False, "error": "the body must be a JSON object"}, 400)
        try:
            message = await run_in_threadpool(actions.run, body)
        except control.LimitControlError as exc:
            return _json({"ok": False, "error": str(exc)}, 400)
        except (RedisError, RedisLockError) as exc:
            return _json({"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 503)
        await run_in_threadpool(dashboard.state, True)
        return _json({"ok": True, "message": message})

    app = Starlette(routes=[
        Route("/", page, methods=["GET", "HEAD"]),
        Route("/static/{name}", static, methods=["GET", "HEAD"]),
        Route("/api/state", state, methods=["GET", "HEAD"]),
        Route("/api/action", action, methods=["GET", "HEAD", "POST", "PUT", "DELETE",
                                              "PATCH"]),
    ])
    return SecurityHeaders(app)
