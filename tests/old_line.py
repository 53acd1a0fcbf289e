"""The retired "store" line's waiting line, as the engine still keeps it (``enqueue.lua``,
the hand-over in ``line.lua``): a test joins it directly, with a message of its own, to
test those scripts. No worker joins it any more.

    >>> unpack_message(pack_message(Signature("t", (1,), task_id="i")))["options"]["task_id"]
    'i'
"""

from __future__ import annotations

import json
import os
from typing import Any, List, Mapping, Optional, Tuple

from celery import Signature

from celery_redislock.engine.scripts import ENQUEUE

__all__ = ["Signature", "join_line", "new_ticket", "pack_message", "unpack_message"]


def new_ticket(task_id: str) -> str:
    """A ticket for one wait of one run: the task id, a dot, a random part."""
    return f"{task_id}.{os.urandom(5).hex()}"


def pack_message(signature: Any, serializer: str = "json") -> str:
    """A task signature as text for the line (JSON)."""
    return json.dumps(dict(signature))


def unpack_message(message: Any) -> Mapping[str, Any]:
    """The signature dict of a message the line handed over (its ``@<where>`` line off)."""
    if isinstance(message, bytes):
        message = message.decode()
    if message.startswith("@"):
        message = message.partition("\n")[2]
    return json.loads(message)


def join_line(client: Any, key: str, ticket: str, since_ms: int, record: str, message: str,
              *, keep_ms: int, reserve_ms: int,
              cost: int = 1) -> Tuple[Optional[int], List[Any]]:
    """Put ``ticket`` in the line of semaphore ``key``: its position (0 = next) and the
    messages of waiters handed a slot meanwhile (``enqueue.lua``)."""
    args: List[Any] = [ticket, since_ms, record, message, keep_ms, reserve_ms]
    if cost != 1:
        args.append(cost)
    reply = ENQUEUE.run(client, [key], args)
    position = int(reply[0])
    return (None if position < 0 else position), list(reply[1:])
