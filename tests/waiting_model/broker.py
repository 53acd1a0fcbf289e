"""The broker: queues of messages, deliveries unacknowledged until acknowledged.

A message is immutable; a copy is a new message (a new ``msg_id``) with the same run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from celery_redislock.run.waiting_run import WaitingRun


@dataclass(frozen=True)
class Message:
    """One message in the broker: the attempt ``(task_id, attempt)`` of a task bound to
    limit ``key``; ``headers`` carry its wait (:class:`WaitingRun`'s header: ``park_id``
    names its parked copy, ``"<incarnation>:<n>"``, "" for a copy never parked; ``move``
    the moved copy's own id)."""

    msg_id: int
    task_id: str
    key: str
    acks_late: bool
    attempt: int = 0
    headers: Mapping[str, object] = field(default_factory=dict)

    @property
    def wait(self) -> WaitingRun:
        return WaitingRun.of_headers(self.headers)

    @property
    def run(self) -> Tuple[str, int]:
        return (self.task_id, self.attempt)


def main_queue(key: str) -> str:
    """The queue of the task bound to ``key`` (one task per key in the model)."""
    return f"main:{key}"


def parking_queue(key: str) -> str:
    """The parking queue of ``key``: no worker consumes it."""
    return f"park:{key}"


@dataclass
class Delivery:
    tag: int
    message: Message
    source: str          # the queue it came from, where a redelivery puts it back
    holder: int          # the worker (its life) it was delivered to


@dataclass
class Broker:
    queues: Dict[str, List[Message]] = field(default_factory=dict)
    unacked: Dict[int, Delivery] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def publish(self, queue: str, message: Message) -> None:
        self.queues.setdefault(queue, []).append(message)

    def copy(self, message: Message, wait: WaitingRun) -> Message:
        """A new message of the same run, carrying ``wait``."""
        return Message(next(self.ids), message.task_id, message.key, message.acks_late,
                       message.attempt, wait.on(dict(message.headers)))

    def get(self, queue: str, holder: int) -> Optional[Delivery]:
        """The head of ``queue``, delivered to ``holder`` (unacknowledged), or None."""
        messages = self.queues.get(queue) or []
        if not messages:
            return None
        delivery = Delivery(next(self.ids), messages.pop(0), queue, holder)
        self.unacked[delivery.tag] = delivery
        return delivery

    def ack(self, tag: int) -> None:
        del self.unacked[tag]

    def requeue(self, tag: int) -> None:
        """``reject(requeue=True)``: the same message back in its queue, in one step."""
        delivery = self.unacked.pop(tag)
        self.publish(delivery.source, delivery.message)

    def lmove(self, source: str, target: str) -> bool:
        """Redis ``LMOVE``: the head of ``source`` to ``target`` in one step."""
        messages = self.queues.get(source) or []
        if not messages:
            return False
        self.publish(target, messages.pop(0))
        return True

    def redeliver(self, dead: int) -> int:
        """Put back every delivery the dead worker life ``dead`` held; how many."""
        tags = [tag for tag, d in self.unacked.items() if d.holder == dead]
        for tag in tags:
            self.requeue(tag)
        return len(tags)

    def length(self, queue: str) -> int:
        return len(self.queues.get(queue) or [])

    def copies(self, run: Tuple[str, int]) -> int:
        """How many messages of ``run`` exist (queued or unacknowledged)."""
        queued = sum(m.run == run for ms in self.queues.values() for m in ms)
        return queued + sum(d.message.run == run for d in self.unacked.values())
