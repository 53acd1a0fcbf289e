"""The worker's connections to the lock store on its event loop (``redislock_gate =
"async"``, the default): one :class:`~..engine.hub_store.HubStore` per worker (its
consumer) and lock store, on the consumer's ``Hub``, made on first use.

Only the prefork and solo pools, with an event loop, and a plain ``redis://`` or
``unix://`` lock store (no TLS, Sentinel or Cluster) are driven so; elsewhere the worker
says so once in its log and asks blocking, as with ``"blocking"``.

    >>> unsupported(None, None)
    'the worker has no event loop (gevent, eventlet, or a transport without one)'
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Dict, Optional, Set

from ..engine.hub_store import HubStore

__all__ = ["POOLS", "HubStore", "hub_store", "unsupported"]

logger = logging.getLogger(__name__)

#: The pools whose requests a main-process event loop hands out (their ``TaskPool``'s
#: module, under ``celery.concurrency``).
POOLS = ("prefork", "solo")


def unsupported(consumer: Any, client: Any) -> Optional[str]:
    """Why the asks of ``consumer`` to ``client``'s store cannot be driven on its event
    loop; None when they can."""
    if getattr(consumer, "hub", None) is None:
        return "the worker has no event loop (gevent, eventlet, or a transport without one)"
    pool = type(getattr(consumer, "pool", None)).__module__.rsplit(".", 1)[-1]
    if pool not in POOLS:
        return f"the {pool} pool reports runs' ends from other threads"
    return HubStore.unsupported(client)


#: Each worker's (consumer's) connections, per lock store (its client's connection pool).
_stores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: The reasons already logged for asking blocking under ``redislock_gate = "async"``.
_said: Set[str] = set()


def hub_store(consumer: Any, client: Any, deadline: float) -> Optional[HubStore]:
    """``consumer``'s connection to ``client``'s lock store, made on first use; None
    (said once in the log) when the worker cannot drive one."""
    stores: Dict[int, HubStore] = _stores.setdefault(consumer, {})
    store = stores.get(id(client))
    if store is not None:
        return store
    why = unsupported(consumer, client)
    if why is not None:
        if why not in _said:
            _said.add(why)
            logger.warning("celery-redislock: redislock_gate = 'async', but %s: this worker "
                           "asks the lock store blocking", why)
        return None
    store = stores[id(client)] = HubStore(consumer.hub, client, deadline)
    logger.info("celery-redislock: the worker's main process asks the lock store without "
                "blocking (redislock_gate = 'async')")
    return store

