"""Why a Redis server could not be reached, in one line an operator can act on.

redis-py reports a misspelt host, a closed port and a silent firewall with the same
``ConnectionError`` class; the cause is in the exception's text or its chain. This module
names where the client was connecting (host and port, or the socket path; never the
password) and which of those it was.

    >>> import redis
    >>> client = redis.Redis(host="no-such-host.invalid", port=6390, socket_connect_timeout=2)
    >>> try:
    ...     client.ping()
    ... except redis.ConnectionError as exc:
    ...     print(unreachable_reason(client, exc))
    no-such-host.invalid:6390: the host name does not resolve (DNS)
"""

from __future__ import annotations

import socket
from typing import Any, Iterator, Optional

import redis

__all__ = ["address_of", "unreachable_reason"]


def address_of(client: Any) -> str:
    """Where ``client`` connects: ``host:port``, a socket path, or a description."""
    pool = getattr(client, "connection_pool", None)
    details = getattr(pool, "connection_kwargs", None) or {}
    if details.get("path"):
        return str(details["path"])
    if details.get("host"):
        return f"{details['host']}:{details.get('port', 6379)}"
    service = getattr(pool, "service_name", None)
    if service:
        return f"the master {service!r} of the sentinels"
    return type(client).__name__


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    link: Optional[BaseException] = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _reason(exc: BaseException) -> str:
    text = " ".join(str(link) for link in _chain(exc)).lower()
    for link in _chain(exc):
        if isinstance(link, socket.gaierror):
            return "the host name does not resolve (DNS)"
        if isinstance(link, ConnectionRefusedError):
            return "connection refused (nothing listens there)"
        if isinstance(link, (socket.timeout, TimeoutError, redis.TimeoutError)):
            return "timed out (a firewall, or a wrong address?)"
        if isinstance(link, redis.AuthenticationError):
            return "authentication failed (check the user name and password)"
    if "name or service not known" in text or "nodename nor servname" in text or (
            "temporary failure in name resolution" in text):
        return "the host name does not resolve (DNS)"
    if "connection refused" in text:
        return "connection refused (nothing listens there)"
    if "timed out" in text or "timeout" in text:
        return "timed out (a firewall, or a wrong address?)"
    if "no such file" in text:
        return "no such socket file"
    return " ".join(str(exc).split()) or type(exc).__name__


def unreachable_reason(client: Any, exc: BaseException) -> str:
    """``"<where>: <why>"`` for a failed connection of ``client``, e.g.
    ``"redis.internal:6379: connection refused (nothing listens there)"``."""
    return f"{address_of(client)}: {_reason(exc)}"
