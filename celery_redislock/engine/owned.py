"""Leases owned by one task id: a task's unique lock and its once-per-period mark.

One Redis string per name (``<prefix>{<digest>}:u:<name>`` for a unique lock,
``...:p:<name>`` for a period), whose value is the owning task id and whose expiry, set
on the Redis server's clock, is the lease. Every operation is one call of
``lua/owned.lua``: take (``SET NX PX``, or again by the same id), compare-and-renew,
compare-and-delete. It has the attributes the lease keeper renews by (``name``,
``token``, ``lease_seconds``, ``renew()``, ``lost``, ``fence``)::

    lock = OwnedLease(client, unique_key("report:7"), "report:7", task_id, lease=30)
    holder = lock.take()          # None: this id holds it now; else the id that does
    ...
    lock.release()                # only if this id still holds it
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .scripts import OWNED


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class OwnedLease:
    """The lease on ``key`` (of limit name ``name``) owned by task id ``owner``."""

    fence = 0

    def __init__(self, client: Any, key: str, name: str, owner: str,
                 lease_seconds: float) -> None:
        self.client = client
        self.key = key
        self.name = name
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.lost = False

    @property
    def token(self) -> str:
        """What the lease keeper knows it by: unique to the key and its owner."""
        return f"{self.owner}@{self.key}"

    def _run(self, operation: str, lease_seconds: Optional[float] = None) -> Any:
        seconds = self.lease_seconds if lease_seconds is None else lease_seconds
        return OWNED.run(self.client, [self.key],
                         [operation, self.owner, max(1, round(seconds * 1000))])

    def take(self, lease_seconds: Optional[float] = None) -> Optional[str]:
        """Hold the key for the lease from now, if free or held by this owner already:
        None; held by another owner: that owner's id (nothing written)."""
        holder = self._run("take", lease_seconds)
        return None if holder is None else _text(holder)

    def once(self, lease_seconds: Optional[float] = None) -> Optional[Tuple[str, float]]:
        """As :meth:`take`, but a key this owner holds keeps its expiry: None; held by
        another owner: ``(its id, seconds left)``."""
        reply = self._run("once", lease_seconds)
        if reply is None:
            return None
        return _text(reply[0]), max(0, int(reply[1])) / 1000.0

    def renew(self, lease_seconds: Optional[float] = None) -> bool:
        """End the lease ``lease_seconds`` (default: its own length) from now; False (and
        ``lost``) if this owner no longer held it."""
        if int(self._run("renew", lease_seconds)):
            return True
        self.lost = True
        return False

    def release(self) -> bool:
        """Delete the key if this owner still holds it (compare-and-delete)."""
        return bool(int(self._run("release")))
