"""The priority a run waits with on the parking line, read in its broker's own order.

The parking line serves higher priorities first (``lua/fair.lua``). A task's
``lock_priority`` is ours and higher first everywhere. A message's ``priority`` property
is the broker's, and brokers disagree on its order:

* RabbitMQ serves higher first (0 to 255), and a message without a priority as 0: it
  waits as sent, and one without a priority as 0;
* kombu's Redis transport serves **0 first**: it clamps a message priority to 0..9
  (``Channel.min_priority`` / ``max_priority``) and consumes the lists of its
  ``priority_steps`` in ascending order; a message sent without one gets 0 (kombu's
  ``default_priority``), served first. So a message priority ``p`` waits as
  ``9 - p``: 0 (and none) as 9, 9 as 0.

    >>> class Request: delivery_info = {"priority": 2}
    >>> priority_of(None, Request()), priority_of(None, Request(), low_first=True)
    (2, 7)
    >>> priority_of(5, Request(), low_first=True), priority_of(None, None)
    (5, 0)
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["KOMBU_MAX_PRIORITY", "priority_of", "serves_low_first"]

#: kombu's highest message priority on its virtual transports (Redis): 0 to 9, 0 first.
KOMBU_MAX_PRIORITY = 9

#: The drivers whose message priorities are served lowest first (kombu's Redis transport,
#: Sentinel included).
LOW_FIRST_DRIVERS = frozenset({"redis"})


def serves_low_first(app: Any) -> bool:
    """Whether ``app``'s broker serves a message priority of 0 first (a Redis broker).
    Reads the transport's class only: no connection is made."""
    try:
        driver = app.connection_for_write().get_transport_cls().driver_type
    except (ImportError, KeyError, ValueError, AttributeError):  # an unknown transport
        return False
    return driver in LOW_FIRST_DRIVERS


def priority_of(option: Optional[int], request: Any, low_first: bool = False) -> int:
    """The priority (higher first) a run waits with on the parking line: the task's
    ``lock_priority`` (``option``), else its message's ``priority`` property in the
    broker's order (``low_first``: a Redis broker, see the module doc), a message
    without one as the broker's default, 0 (on Redis: first, 9 here)."""
    if option is not None:
        return option
    info = getattr(request, "delivery_info", None)
    value = info.get("priority") if isinstance(info, dict) else None
    sent = value if isinstance(value, int) and not isinstance(value, bool) else 0
    if low_first:
        return KOMBU_MAX_PRIORITY - min(max(sent, 0), KOMBU_MAX_PRIORITY)
    return min(max(sent, 0), 255)
