"""A message's priority read in its broker's order (:mod:`celery_redislock.line.priority`):
RabbitMQ serves higher first, kombu's Redis transport 0 first; ``lock_priority`` is
higher first on every broker. The real-worker ordering check is in ``test_fair_line.py``."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from celery import Celery

from celery_redislock.line.priority import priority_of, serves_low_first


class Request:
    def __init__(self, priority: Optional[Any]) -> None:
        self.delivery_info = {"priority": priority} if priority is not None else {}


@pytest.mark.parametrize("sent, waits", [(0, 9), (3, 6), (9, 0), (12, 0), (-1, 9), (None, 9)])
def test_a_redis_message_priority_waits_as_9_minus_it(sent: Any, waits: int) -> None:
    """kombu's Redis transport clamps to 0..9 and serves 0 first (a message sent without
    one carries 0): here it waits as 9 - p, higher first."""
    assert priority_of(None, Request(sent), low_first=True) == waits


@pytest.mark.parametrize("sent, waits", [(0, 0), (5, 5), (255, 255), (None, 0), (True, 0)])
def test_a_rabbitmq_message_priority_waits_as_sent(sent: Any, waits: int) -> None:
    """RabbitMQ serves higher first and a message without a priority as 0."""
    assert priority_of(None, Request(sent)) == waits


@pytest.mark.parametrize("low_first", [False, True])
def test_lock_priority_is_higher_first_on_every_broker(low_first: bool) -> None:
    assert priority_of(7, Request(0), low_first=low_first) == 7
    assert priority_of(0, Request(9), low_first=low_first) == 0


@pytest.mark.parametrize("url, low_first", [
    ("redis://localhost:1/0", True), ("rediss://localhost:1/0", True),
    ("sentinel://localhost:1", True), ("amqp://guest@localhost:1//", False),
    ("pyamqp://guest@localhost:1//", False), ("memory://", False),
])
def test_the_broker_order_is_read_from_the_transport_class(url: str, low_first: bool) -> None:
    """No connection is made (the ports above have no server)."""
    assert serves_low_first(Celery(broker=url, set_as_current=False)) is low_first
