"""Who may change a limit through the dashboard: the rules of its POST requests.

An action is accepted only when the dashboard was started with actions allowed and a
token, and the request

* is a ``POST`` with a JSON body (``Content-Type: application/json``): an HTML form
  cannot send one, and a cross-site script cannot without a CORS preflight, which this
  server never answers;
* carries the token in the :data:`TOKEN_HEADER` header (compared in constant time): a
  browser adds no such header to a forged request, and it is never stored in a cookie;
* comes, when the browser says where from (``Origin``, ``Sec-Fetch-Site``), from the
  dashboard's own origin or one allowed with ``--allowed-origin``.

    >>> same_host("https://ops.example.com", ["ops.example.com"])
    True
    >>> same_host("https://evil.example", ["ops.example.com"])
    False
"""

from __future__ import annotations

import hmac
from typing import Iterable, Mapping, Optional, Sequence
from urllib.parse import urlsplit

#: The request header that carries the dashboard's token.
TOKEN_HEADER = "X-Redislock-Token"

#: The environment variable the ``web`` command reads the token from.
TOKEN_ENV = "REDISLOCK_WEB_TOKEN"

#: The shortest token accepted (characters).
MIN_TOKEN_LENGTH = 16

_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _host_port(netloc: str, scheme: str) -> str:
    """``host[:port]`` of ``netloc`` in lower case, without the scheme's default port."""
    parts = urlsplit(f"//{netloc.strip()}")
    try:
        port = parts.port
    except ValueError:
        return netloc.strip().lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or str(port) == _DEFAULT_PORTS.get(scheme):
        return host
    return f"{host}:{port}"


def same_host(origin: str, hosts: Iterable[str]) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) names one of ``hosts`` (``Host``
    header values). Default ports are ignored: a TLS proxy in front keeps its origin."""
    parts = urlsplit(origin)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False
    wanted = _host_port(parts.netloc, parts.scheme)
    return any(host.strip() and _host_port(host, parts.scheme) == wanted for host in hosts)


def refusal(method: str, headers: Mapping[str, str], token: Optional[str],
            allowed_origins: Sequence[str] = ()) -> Optional[str]:
    """Why an action request must be refused, or None to accept it.

    ``headers`` are the request's (keys lower case); ``token`` is the dashboard's, None
    when actions are not allowed.
    """
    if token is None:
        return "actions are off: start the dashboard with --allow-actions and a token"
    if method != "POST":
        return "actions are POST requests"
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        return "actions take a JSON body (Content-Type: application/json)"
    origin = headers.get("origin")
    if origin is not None:
        hosts = [headers.get("host", ""), *headers.get("x-forwarded-host", "").split(",")]
        if origin not in allowed_origins and not same_host(origin, hosts):
            return f"cross-origin request refused (Origin {origin})"
    elif headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused (Sec-Fetch-Site)"
    given = headers.get(TOKEN_HEADER.lower(), "")
    if not hmac.compare_digest(given.encode(), token.encode()):
        return f"missing or wrong {TOKEN_HEADER} header"
    return None
