"""How many messages the parking queues of an app's broker hold, for the views of the
parked line (the operators' CLI and page, the metrics). Read only: one ``LLEN`` per
queue on a Redis broker (one pipeline), a passive declare per queue on RabbitMQ. The
app is anything with Celery's ``connection_for_read`` (a kombu connection factory).

A view that cannot reach the broker (or has no app) shows the lock store's counts alone,
and the queue's length as unknown (``None``); :attr:`ParkingQueues.error` says why.

    queues = ParkingQueues(app)
    queues.lengths(["redislock:{85280b862f4ca735}:s:customer:42"])   # {key: 12} or None
    queues.close()
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Optional, Sequence

from .lengths import parked_lengths
from .transport import broker_for

__all__ = ["ParkingQueues"]

#: Seconds to wait for the broker when connecting.
CONNECT_TIMEOUT = 2.0


class ParkingQueues:
    """Lengths of parking queues in ``app``'s broker, over one connection kept open
    until :meth:`close` (made again after a failure, at the next call)."""

    def __init__(self, app: Any, *, timeout: float = CONNECT_TIMEOUT) -> None:
        self.app = app
        self.timeout = timeout
        self.error: Optional[str] = None
        self._connection: Any = None
        self._broker: Any = None

    def lengths(self, keys: Sequence[str]) -> Optional[Dict[str, int]]:
        """``{semaphore key: messages in its parking queue}`` (0 for a queue that does
        not exist), or None when the broker could not be asked (see :attr:`error`)."""
        if not keys:
            return {}
        try:
            if self._broker is None:
                connection = self.app.connection_for_read(connect_timeout=self.timeout)
                self._connection = connection
                connection.ensure_connection(max_retries=0)
                self._broker = broker_for(connection)
            found = parked_lengths(self._broker, keys)
        except Exception as exc:  # any broker, any failure: the view goes on without it
            self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
            self.close()
            return None
        self.error = None
        return found

    def close(self) -> None:
        """Close the broker connection, if open."""
        connection, self._connection, self._broker = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken connection: nothing more to do
                connection.release()
