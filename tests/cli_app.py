"""A tiny Celery app for the ``celery -A cli_app redislock ...`` tests of ``test_cli.py``.

Its lock store URL comes from the environment variable :data:`URL_ENV`, so a test can run
the real ``celery`` command against the session's private redis-server.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_redislock import LimitedTask

URL_ENV = "CLI_APP_REDISLOCK_URL"
CRAWL = "cli_app.crawl"


def create_app(url: str) -> Celery:
    """An app with its lock store at ``url`` and one task limited to two slots.

    Example::

        app = create_app("redis://127.0.0.1:6379/0")
        app.tasks[CRAWL].lock_slots   # 2
    """
    app = Celery("cli_app", set_as_current=False)
    app.conf.redislock_url = url

    @app.task(base=LimitedTask, lock_slots=2, name=CRAWL, shared=False)
    def crawl() -> None:
        return None

    return app


app = create_app(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/0"))
