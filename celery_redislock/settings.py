"""The app-level settings of celery-redislock, and the Redis client they describe.

=========================  ==============================================================
``redislock_url``          Redis URL of the lock store. Unset: the broker URL if it is a
                           Redis URL, else the result backend's if it is one, else
                           ``redis://localhost:6379/0``.
``redislock_client``       A ready redis-py client (or a callable returning one), used
                           instead of ``redislock_url``.
``redislock_key_prefix``   Start of every Redis key the package writes
                           (default ``"redislock:"``).
``redislock_enabled``      ``False`` switches every limit off: task bodies run with no
                           Redis call at all (for unit tests). Default ``True``.
=========================  ==============================================================
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import redis

from .errors import LockConfigurationError
from .keys import DEFAULT_PREFIX, check_prefix

DEFAULT_URL = "redis://localhost:6379/0"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class Settings:
    """The package's settings as read from one Celery app's configuration."""

    url: str
    prefix: str
    enabled: bool
    client: Any = None


def read_settings(app: Any) -> Settings:
    """Read and check the ``redislock_*`` settings of ``app``.

    Raises :class:`LockConfigurationError` naming the setting that is wrong.
    """
    conf = app.conf
    enabled = conf.get("redislock_enabled", True)
    if not isinstance(enabled, bool):
        raise LockConfigurationError(
            f"setting redislock_enabled must be True or False, not {enabled!r}"
        )
    url = conf.get("redislock_url") or _redis_url_of(conf.get("broker_url")) \
        or _redis_url_of(conf.get("result_backend")) or DEFAULT_URL
    if not isinstance(url, str) or not url.startswith(REDIS_SCHEMES):
        raise LockConfigurationError(
            f"setting redislock_url must be a redis://, rediss:// or unix:// URL, not {url!r}"
        )
    prefix = check_prefix(conf.get("redislock_key_prefix", DEFAULT_PREFIX))
    return Settings(url=url, prefix=prefix, enabled=enabled,
                    client=conf.get("redislock_client"))


def _redis_url_of(url: Any) -> Optional[str]:
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if isinstance(url, str):
        first = url.split(";")[0].strip()
        if first.startswith(REDIS_SCHEMES):
            return first
    return None


_clients: Dict[Tuple[int, str], Any] = {}
_clients_guard = threading.Lock()


def redis_client(app: Any, settings: Optional[Settings] = None) -> Any:
    """The Redis client that holds ``app``'s semaphores, made once per app and URL.

    redis-py's connection pool notices a fork and opens new connections in the child,
    so one client serves every process of a prefork worker.
    """
    settings = settings or read_settings(app)
    if settings.client is not None and not callable(settings.client):
        return settings.client
    cache_key = (id(app), settings.url if settings.client is None else repr(settings.client))
    client = _clients.get(cache_key)
    if client is None:
        with _clients_guard:
            client = _clients.get(cache_key)
            if client is None:
                if settings.client is not None:
                    client = settings.client()
                else:
                    client = redis.Redis.from_url(
                        settings.url, socket_timeout=10, socket_connect_timeout=5,
                        health_check_interval=30,
                    )
                _clients[cache_key] = client
    return client
