"""A standby is never held past half the broker's visibility timeout (``gate/standby.py``):
its message is unacknowledged while held, and kombu's Redis and SQS transports give back
a message unacknowledged longer than ``visibility_timeout``, a second copy of the run.
Past the bound the copy asks as any moved copy: it takes a slot, or parks again (moved:
a fresh message)."""

from __future__ import annotations

import time

from celery_redislock.gate import standby

KEY = "redislock:{ab}:s:fair"


def _line_with_room() -> standby.Standbys:
    mine = standby.Standbys()
    mine.line(KEY).running["run-1"] = None  # one run of KEY here: room for two standbys
    return mine


def test_a_new_copy_is_held_when_one_recheck_fits_within_the_ceiling() -> None:
    assert standby._may_hold(_line_with_room(), KEY, None, ceiling=1800.0)
    assert standby._may_hold(_line_with_room(), KEY, None, ceiling=None)


def test_no_copy_is_held_when_one_recheck_is_longer_than_the_ceiling() -> None:
    assert not standby._may_hold(_line_with_room(), KEY, None, ceiling=standby.RECHECK / 2)


def test_a_standby_held_near_the_ceiling_is_not_held_again() -> None:
    """With a visibility timeout of 3 s (ceiling 1.5 s), a standby first asked 1 s ago
    is not held for another second: it would still be unacknowledged at 2 s."""
    copy = standby.Standby(KEY, request=None, holds=1, since=time.monotonic() - 1.0)
    assert not standby._may_hold(_line_with_room(), KEY, copy, ceiling=1.5)
    assert standby._may_hold(_line_with_room(), KEY, copy, ceiling=1800.0)


def test_holds_in_a_row_stay_bounded_without_a_timeout() -> None:
    copy = standby.Standby(KEY, request=None, holds=standby.MAX_HOLDS)
    assert not standby._may_hold(_line_with_room(), KEY, copy, ceiling=None)
