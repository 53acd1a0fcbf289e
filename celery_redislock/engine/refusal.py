"""What a Redis error from the lock store means: an outage, or a refusal.

An outage (no connection, a replica that is read-only during a fail-over, a server
still loading its data) passes: runs wait for it. A full store (``OOM`` under
``noeviction``) is reported as such and runs wait too. Everything else the server says
no to is a configuration error (authentication, ACL permissions, a missing command, a
script error): waiting will not end it, so it is logged as an error with the server's
message, and a worker does not start with it (:func:`lock_store_problems`).

    >>> from redis.exceptions import ReadOnlyError
    >>> error_kind(ReadOnlyError("You can't write against a read only replica."))
    'readonly'
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ConnectionError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TimeoutError,
)

#: Kinds of errors that pass by themselves: runs wait for them as for an outage.
TRANSIENT = frozenset({"unreachable", "readonly", "loading"})

#: Every kind :func:`error_kind` returns, with what it means in a log line.
KINDS = {
    "unreachable": "lock store unreachable",
    "readonly": "lock store is a read-only replica (fail-over under way?)",
    "loading": "lock store is loading its data",
    "full": "lock store full (maxmemory reached under noeviction)",
    "auth": "lock store refused the credentials",
    "permission": "lock store refused a command (ACL permissions)",
    "unknown_command": "lock store does not know a command the package needs",
    "script": "lock store script error",
}

#: The commands the package sends, directly or from its scripts (an ACL user for the lock
#: store needs them, see docs/security.md). ``config|get`` only reads
#: ``maxmemory-policy``; ``select`` is for a database other than 0. (redis-py also sends
#: ``CLIENT SETINFO`` as it connects, and ignores a refusal: Redis 7.0 has no such command.)
REQUIRED_COMMANDS = (
    "evalsha", "eval", "ping", "info", "time", "scan", "select", "config|get", "exists",
    "pttl", "pexpire", "zadd", "zrem", "zscore", "zmscore", "zcount", "zcard", "zrank",
    "zrange", "zrangebyscore", "zremrangebyscore", "hget", "hset", "hmget", "hdel",
    "hexists", "hincrby", "hlen", "get", "set", "del", "rpush", "lpop", "lindex", "llen",
    "lrange", "ltrim", "lset", "lpush",
)


def acl_setuser(user: str, password: str, prefix: str = "redislock:") -> List[str]:
    """The ``ACL SETUSER`` arguments for a user that may do what the package needs on
    the keys under ``prefix``, and nothing else.

        >>> " ".join(acl_setuser("locks", "secret")[:8])
        'ACL SETUSER locks reset on >secret ~redislock:* resetchannels'
    """
    return ["ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{prefix}*",
            "resetchannels", "-@all", *(f"+{command}" for command in REQUIRED_COMMANDS)]


#: The oldest Redis the scripts run on (``ZMSCORE``).
MIN_REDIS = (6, 2)

#: The only ``maxmemory-policy`` under which Redis never deletes the package's keys:
#: every key the package writes has a TTL, so ``volatile-*`` policies evict them too.
SAFE_POLICY = "noeviction"


def error_kind(exc: BaseException) -> str:
    """The kind of a Redis error (a key of :data:`KINDS`)."""
    text = str(exc)
    if isinstance(exc, AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return "auth"
    if isinstance(exc, BusyLoadingError) or text.startswith("LOADING"):
        return "loading"
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return "unreachable"
    if isinstance(exc, OutOfMemoryError) or text.startswith("OOM"):
        return "full"
    if isinstance(exc, ReadOnlyError) or text.startswith("READONLY"):
        return "readonly"
    if isinstance(exc, NoPermissionError) or text.startswith("NOPERM"):
        return "permission"
    if "unknown command" in text.lower() or "unknown redis command" in text.lower():
        return "unknown_command"
    return "script" if isinstance(exc, (ResponseError, RedisError)) else "unreachable"


def is_transient(exc: BaseException) -> bool:
    """True for errors that pass by themselves (an outage, a fail-over, loading)."""
    return error_kind(exc) in TRANSIENT


#: The error codes redis-py takes off the server's message when it picks an exception
#: class (and its ``repr`` shows neither): put back for the logs.
_CODES = ((NoPermissionError, "NOPERM"), (OutOfMemoryError, "OOM"), (ReadOnlyError, "READONLY"),
          (BusyLoadingError, "LOADING"), (NoScriptError, "NOSCRIPT"))


def server_message(exc: BaseException) -> str:
    """The server's message of a Redis error, with its error code in front.

        >>> server_message(OutOfMemoryError("command not allowed"))
        'OOM command not allowed'
    """
    text = str(exc) or type(exc).__name__
    for cls, code in _CODES:
        if isinstance(exc, cls) and not text.startswith(code):
            return f"{code} {text}"
    return text


def describe_error(exc: BaseException) -> str:
    """What the error means and the server's own message, for a log line.

        >>> describe_error(OutOfMemoryError("command not allowed"))
        'lock store full (maxmemory reached under noeviction): OOM command not allowed'
    """
    return f"{KINDS[error_kind(exc)]}: {server_message(exc)}"


def eviction_policy(client: Any) -> Tuple[Optional[str], Optional[str]]:
    """The lock store's ``maxmemory-policy`` and None; or None and why it could not be
    read (``CONFIG GET`` refused, e.g. by an ACL or a managed service)."""
    try:
        reply = client.config_get("maxmemory-policy")
    except RedisError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    policy = reply.get("maxmemory-policy") or reply.get(b"maxmemory-policy")
    if isinstance(policy, bytes):
        policy = policy.decode()
    if not policy:
        return None, "CONFIG GET maxmemory-policy gave no answer"
    return policy, None


def eviction_warning(client: Any) -> Optional[str]:
    """A warning if the lock store may evict the package's keys, or cannot tell."""
    policy, why = eviction_policy(client)
    if policy is None:
        return (f"could not read maxmemory-policy of the lock store ({why}); make sure it "
                f"is {SAFE_POLICY}: any other policy may delete held slots and waiting lines")
    if policy != SAFE_POLICY:
        return (f"the lock store's maxmemory-policy is {policy}: Redis may delete held slots "
                f"and waiting lines when memory runs short (every key of the package has a "
                f"TTL, so volatile-* policies evict them too), letting more runs in than the "
                f"limit; set maxmemory-policy {SAFE_POLICY}")
    return None


def lock_store_problems(client: Any, probe_script: Any) -> List[str]:
    """What stops the package from working on this lock store, as sentences with the
    server's message and what to do; empty if none. Outages are not problems here
    (a worker may start before its lock store). ``probe_script`` runs one of the
    package's scripts (read-only use of a key) so that ACL rules on scripts show."""
    problems: List[str] = []
    try:
        version = _server_version(client)
        if version is not None and version < MIN_REDIS:
            problems.append(f"the lock store runs Redis {'.'.join(map(str, version))}; the "
                            f"package needs Redis {MIN_REDIS[0]}.{MIN_REDIS[1]} or later")
        probe_script()
    except RedisError as exc:
        if not is_transient(exc):
            problems.append(f"{describe_error(exc)} ({_advice(error_kind(exc))})")
    return problems


def _server_version(client: Any) -> Optional[Tuple[int, ...]]:
    """The lock store's Redis version (major, minor), or None if ``INFO`` is refused
    (the scripts then find out for themselves)."""
    try:
        info = client.info("server")
    except ResponseError as exc:
        if error_kind(exc) in ("permission", "unknown_command"):
            return None
        raise
    text = str(info.get("redis_version", "0"))
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def _advice(kind: str) -> str:
    return {
        "auth": "check the user name and password in redislock_url",
        "permission": "grant the lock store's user the commands and keys the package needs "
                      "(docs/security.md: the ACL SETUSER line)",
        "unknown_command": "the package needs Redis 6.2 or later with scripting enabled",
        "full": "free memory in the lock store or raise its maxmemory",
    }.get(kind, "see the server's message")


def error_text(exc: BaseException) -> str:
    """:func:`describe_error` for a Redis error, else the exception's ``repr``: for log
    lines about calls that may fail in other ways too."""
    return describe_error(exc) if isinstance(exc, RedisError) else repr(exc)
