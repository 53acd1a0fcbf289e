"""Fair hand-off: a freed slot goes at once to the run that has waited longest.

A run that finds a semaphore full joins the semaphore's *waiting line* in Redis, ordered
by when it first asked, and goes back to the broker with a countdown as before (the
*waiting copy* of its message). Its line entry holds a second copy of its message. When
a slot frees (a release, a crashed holder's slots freed by its worker, an operator
raising the limit) the script that frees it also *reserves* it for the oldest waiter
and hands back that waiter's message, which the caller re-publishes at once (the
*express copy*). Whichever copy reaches a worker first takes the reserved slot; the
line then remembers the ticket as served, and the other copy, when it arrives, finds
that and ends without running the task body. Newcomers never take a slot while older
runs wait for it.

Every step is safe against a crash between steps:

* the waiting copy is always in the broker, so a run is never lost: if the express
  copy is never published (the releasing worker died) or never arrives, the
  reservation lapses after :data:`RESERVATION` seconds and the slot is offered again,
  and the waiting copy comes back on its own countdown in any case;
* a ticket is remembered as served for longer than the waiting copy's countdown plus
  :data:`~celery_redislock.config.retry.SERVED_MEMORY` seconds, so the second copy does
  not run the task again.
  If the lock store loses its data (a restart without persistence) within that time,
  the second copy may run: the choice is to run a task twice rather than lose it.

This module builds tickets and messages and re-publishes them; the Lua scripts
(``line.lua`` and its users) do the rest, each in one atomic step.

    >>> ticket = new_ticket("5f0c")
    >>> ticket.startswith("5f0c.")
    True
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from kombu.serialization import dumps, loads, prepare_accept_content

from ..config.settings import read_settings, redis_client
from ..engine.keys import companion_key
from ..engine.scripts import ENQUEUE, LEAVE_LINE, WAKE
from . import broker_line, signals

logger = logging.getLogger(__name__)


#: How long a slot handed to a waiter is kept for it (seconds, at most the lease):
#: time for its express copy to reach a worker.
RESERVATION = 10.0



def new_ticket(task_id: str) -> str:
    """A ticket for one wait of one run: the task id, a dot, a random part."""
    return f"{task_id}.{os.urandom(5).hex()}"


def new_copy_id() -> str:
    """The identity of one copy of a waiting run's message: a served ticket remembers
    which copy was admitted, so that the broker redelivering that same message (its
    worker died) is not mistaken for the other copy."""
    return os.urandom(4).hex()


def reservation_ms(lease: float) -> int:
    """How long (ms) a slot handed to a waiter stays reserved, for a given lease."""
    return max(1, round(min(RESERVATION, lease) * 1000))



#: The first line of a signed parked message: this, then the HMAC-SHA256 (hex).
SIGNATURE_MARK = "hmac-sha256:"

#: Content types never decoded from the lock store without a valid signature.
UNSAFE_CONTENT = frozenset({"application/x-python-serialize"})


class RejectedEntry(Exception):
    """A parked message that failed its check: unsigned or wrongly signed while a
    signing key is set, or in a content type the app does not accept."""


@dataclass(frozen=True)
class Trust:
    """How parked messages are written and checked for one app: the signing key (or
    None) and the content types they may be decoded from (the app's
    ``accept_content``; without a key, never pickle)."""

    key: Optional[bytes]
    accept: FrozenSet[str]

    @classmethod
    def of(cls, app: Any) -> Trust:
        key = read_settings(app).signing_key
        accept = frozenset(prepare_accept_content(app.conf.accept_content or ["json"]))
        return cls(key, accept if key is not None else accept - UNSAFE_CONTENT)


def pack_message(signature: Any, serializer: str, key: Optional[bytes] = None) -> Optional[str]:
    """A task signature as text for the line: serialized as the task's messages are,
    and signed with ``key`` if one is given. Without a key a pickle message is parked
    as JSON instead (None if it cannot be: the run then waits on its countdown).

        >>> from celery import Signature
        >>> unpack_message(pack_message(Signature("t", (1,)), "json"))["args"]
        [1]
    """
    if key is None and serializer in ("pickle", *UNSAFE_CONTENT):
        serializer = "json"
    try:
        content_type, encoding, body = dumps(dict(signature), serializer=serializer)
    except Exception:  # not JSON-serializable: no hand-off for this run
        return None
    if isinstance(body, bytes):
        text = f"{content_type}\n{encoding}\nb64\n{base64.b64encode(body).decode()}"
    else:
        text = f"{content_type}\n{encoding}\ntext\n{body}"
    if key is None:
        return text
    return f"{SIGNATURE_MARK}{_mac(key, text)}\n{text}"


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def where_from(message: Any) -> Tuple[str, str]:
    """Where a handed-over message was read (``"<hash key> m:<ticket>"``, or "" when
    the script did not say) and the message itself."""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "surrogateescape")
    if message.startswith("@"):
        where, _, message = message.partition("\n")
        return where[1:], message
    return "", message


def unpack_message(message: Any, trust: Optional[Trust] = None) -> Mapping[str, Any]:
    """The signature dict of a message written by :func:`pack_message`, checked against
    ``trust`` (default: no key, JSON only). Raises :class:`RejectedEntry` when the
    message fails the check; it is then never decoded."""
    trust = trust or Trust(None, frozenset({"application/json"}))
    _, text = where_from(message)
    if text.startswith(SIGNATURE_MARK):
        mark, _, text = text.partition("\n")
        if trust.key is not None and not hmac.compare_digest(
                mark[len(SIGNATURE_MARK):], _mac(trust.key, text)):
            raise RejectedEntry("its signature does not match redislock_signing_key")
    elif trust.key is not None:
        raise RejectedEntry("it is not signed, and redislock_signing_key is set")
    try:
        content_type, encoding, form, body = text.split("\n", 3)
    except ValueError:
        raise RejectedEntry("it is not a parked message") from None
    if content_type not in trust.accept:
        raise RejectedEntry(f"its content type {content_type!r} is not accepted "
                            f"(accept_content{'' if trust.key else ', never pickle unsigned'})")
    data: Any = base64.b64decode(body) if form == "b64" else body
    fields = loads(data, content_type, encoding, accept=trust.accept)
    if not isinstance(fields, dict) or not isinstance(fields.get("task"), str):
        raise RejectedEntry("it does not hold a task signature")
    return fields


def waiter_record(task_name: str, task_id: str, worker: Optional[str], since_ms: int) -> str:
    """What operators see of a waiter (``celery redislock inspect``)."""
    return json.dumps({"task": task_name, "id": task_id, "worker": worker, "since": since_ms})


def join_line(
    client: Any,
    key: str,
    ticket: str,
    since_ms: int,
    record: str,
    message: str,
    *,
    keep_ms: int,
    reserve_ms: int,
    cost: int = 1,
) -> Tuple[Optional[int], List[Any]]:
    """Put ``ticket`` in the line of semaphore ``key``; its position (0 = next) and the
    messages of waiters handed a slot meanwhile (maybe its own), to re-publish. ``cost``
    is how many slots the run takes at once: that many are handed to it together."""
    args = [ticket, since_ms, record, message, keep_ms, reserve_ms]
    if cost != 1:
        args.append(cost)
    reply = ENQUEUE.run(client, [key], args)
    position = int(reply[0])
    return (None if position < 0 else position), list(reply[1:])


def leave_line(client: Any, keys: Sequence[str], task_id: str) -> int:
    """Take every ticket of ``task_id`` out of the lines of ``keys`` (it gave up, or it
    was revoked): it must not be handed a slot. Returns how many were dropped."""
    if not keys:
        return 0
    return int(LEAVE_LINE.run(client, list(keys), [f"{task_id}."]))


def publish(app: Any, messages: Iterable[Any]) -> int:
    """Owe the moves out of parking lines that a script handed over (see
    :func:`.broker_line.owe`); returns 0: a message kept in the lock store (by a worker
    of an earlier version, on its "store" line) is never sent nor decoded: it is logged
    as an error naming where it was read, counted (signal ``lock_store_error``, kind
    ``rejected_entry``) and taken out of its line. Its run's waiting copy is still in
    the broker, so no task is lost by it.
    """
    messages, moves = broker_line.split(messages)
    if moves:
        broker_line.owe(app, moves)
    for message in messages:  # the parking line keeps no messages in the lock store
        _reject(app, message, RejectedEntry(
            "a worker on the parking line runs nothing kept in the lock store"))
    return 0


def _reject(app: Any, message: Any, exc: Exception) -> None:
    """Log, count and drop a parked message that failed its check."""
    where, _ = where_from(message)
    reason = str(exc) if isinstance(exc, RejectedEntry) else f"it cannot be decoded: {exc!r}"
    logger.error("celery-redislock: dropped the parked message %s from the lock store, never "
                 "run: %s. Someone who can write to the lock store may have put it there "
                 "(or the workers do not share one redislock_signing_key)",
                 where or "(place unknown)", reason)
    signals.lock_store_error.send(sender=app, task_id=None, key=where or None,
                                  kind="rejected_entry", message=reason)
    hash_key, _, field = where.partition(" m:")
    if hash_key and field:
        try:
            LEAVE_LINE.run(redis_client(app), [companion_key(hash_key, "s")], [field])
        except Exception as drop_error:  # it lapses with its ticket's time
            logger.warning("celery-redislock: could not take %s out of its line: %r",
                           where, drop_error)


def wake_waiters(app: Any, semaphore_key: str, lease: float = RESERVATION) -> int:
    """Hand the free slots of ``semaphore_key`` to its oldest waiters now, re-publishing
    their messages; returns how many were woken. For after an operator raised a limit or
    ended a pause::

        set_slots(app, "crawl", 5)
        wake_waiters(app, semaphore_key("crawl", prefix))
    """
    client = redis_client(app, read_settings(app))
    messages = WAKE.run(client, [semaphore_key], [reservation_ms(lease)])
    return publish(app, messages)
