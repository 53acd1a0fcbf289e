"""What the lock store's scripts hand over as they free slots: the moves owed out of
parking queues (the parking line; see :mod:`.moves`), owed by this process's
mover, and how long a slot handed over stays reserved.

    >>> reservation_ms(30.0), reservation_ms(2.5)
    (10000, 2500)
"""

from __future__ import annotations

from typing import Any, Iterable

from ..config.settings import read_settings, redis_client
from ..engine.scripts import WAKE
from . import moves

#: How long a slot handed to the line is kept for it (seconds, at most the lease): time
#: for the run moved out of its parking queue to reach a worker.
RESERVATION = 10.0


def reservation_ms(lease: float) -> int:
    """How long (ms) a slot handed to the line stays reserved, for a given lease."""
    return max(1, round(min(RESERVATION, lease) * 1000))


def publish(app: Any, handed: Iterable[Any]) -> int:
    """Owe the moves out of parking lines that a script handed over (see
    :func:`.moves.owe`): :class:`~celery_redislock.engine.admission.ParkedMove`
    entries, or a script's raw ``"!move <n> <key>"`` entries. Returns how many moves
    were owed (the mover moves the parked runs)."""
    owed = moves.moves_owed(handed)
    if owed:
        moves.owe(app, owed)
    return len(owed)


def wake_waiters(app: Any, semaphore_key: str, lease: float = RESERVATION) -> int:
    """Hand the free slots of ``semaphore_key`` to its parked line now (its moves owed
    go to this process's mover); returns how many runs were woken. For after an operator
    raised a limit or ended a pause::

        set_slots(app, "crawl", 5)
        wake_waiters(app, semaphore_key("crawl", prefix))
    """
    client = redis_client(app, read_settings(app))
    handed = WAKE.run(client, [semaphore_key], [reservation_ms(lease)])
    return publish(app, handed)
