"""A lock store behind Redis Sentinel, from a ``sentinel://`` URL in the form kombu accepts.

    app.conf.redislock_url = "sentinel://:secret@10.0.0.1:26379/1;sentinel://10.0.0.2:26379/1"
    app.conf.redislock_transport_options = {"master_name": "mymaster"}

Several sentinels are separated by ``;``; the password and database number are taken from
the first URL that has them (the password is the master's; use ``sentinel_kwargs`` for
sentinels that need their own). When the lock store is the broker (no ``redislock_url``),
the broker's ``broker_transport_options`` are read instead, as kombu does.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple
from urllib.parse import unquote, urlparse

from redis.sentinel import Sentinel

from ..errors import LockConfigurationError

SCHEME = "sentinel://"


def sentinel_master(url: str, options: Mapping[str, Any], **client_options: Any) -> Any:
    """A redis-py client of the master that the sentinels in ``url`` name ``master_name``."""
    master_name = options.get("master_name")
    if not master_name:
        raise LockConfigurationError(
            f"lock store {url!r} is a sentinel:// URL: give the master's name, e.g. "
            "redislock_transport_options = {'master_name': 'mymaster'}"
        )
    hosts: List[Tuple[str, int]] = []
    password: Optional[str] = None
    username: Optional[str] = None
    db = 0
    for part in url.split(";"):
        parsed = urlparse(part.strip())
        if parsed.scheme != "sentinel" or not parsed.hostname:
            raise LockConfigurationError(f"lock store URL part {part!r} is not sentinel://host")
        hosts.append((parsed.hostname, parsed.port or 26379))
        password = password or (unquote(parsed.password) if parsed.password else None)
        username = username or (unquote(parsed.username) if parsed.username else None)
        if parsed.path.strip("/"):
            db = int(parsed.path.strip("/"))
    sentinel = Sentinel(hosts, sentinel_kwargs=options.get("sentinel_kwargs"),
                        **client_options)
    return sentinel.master_for(master_name, db=db, password=password, username=username,
                               **client_options)
