"""The mover of a process belongs to one app: a process that moves for another app (an
embedded worker after another, as in the test suite) gets a mover on that app's broker,
not one left connected to a broker that is gone."""

from __future__ import annotations

from celery import Celery

from celery_redislock.line import moves, poll

from support import wait_until


def test_a_process_gets_a_new_mover_for_another_app() -> None:
    first_app = Celery("first", broker="memory://", set_as_current=False)
    second_app = Celery("second", broker="memory://", set_as_current=False)
    try:
        first = moves.mover(first_app)
        assert moves.mover(first_app) is first
        second = moves.mover(second_app)
        assert second is not first
        assert moves.mover(second_app) is second
        wait_until(lambda: not first._thread.is_alive(), 10, what="the first mover to stop")
    finally:
        poll._stop()
